"""A plugin module whose first import (by a test's first fork server) stops the importing
process, as a debugger or job control would."""

from tests.support.fakes import stop_once

stop_once("server")
