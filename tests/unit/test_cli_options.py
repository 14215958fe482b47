"""One rule for options: every option of every command that takes several values takes them
after one flag, as --backends does."""

from __future__ import annotations

from typing import Any

import typer

from xbench.cli.main import app, command_line, expand_variadic, main, variadic_options


def commands() -> dict[str, Any]:
    group: Any = typer.main.get_command(app)
    return dict(group.commands)


def test_every_option_that_takes_a_list_takes_its_values_after_one_flag():
    found = []
    for name, command in commands().items():
        for param in command.params:
            if param.param_type_name != "option" or not param.multiple:
                continue
            flag = param.opts[0]
            found.append(flag)
            assert expand_variadic([name, flag, "a", "b"]) == [name, flag, "a", flag, "b"], (name, flag)
            parser = command.make_parser(command.make_context(name, [], resilient_parsing=True))
            for written in ([flag, "a", "b"], [f"{flag}=a", "b"]):  # both forms a user types
                values, rest, _ = parser.parse_args(expand_variadic(written))
                assert list(values[param.name]) == ["a", "b"] and not rest, (name, written)
    assert {"--backends", "--variants", "--option", "--model", "--devices"} <= set(found) <= variadic_options()


def test_docs_example_of_two_variants_after_one_flag_parses():
    args = expand_variadic(["compare", "--backends", "tf", "torch", "--variants", "tf:xla", "torch:compile",
                            "--no-verify"])
    assert args == ["compare", "--backends", "tf", "--backends", "torch", "--variants", "tf:xla", "--variants",
                    "torch:compile", "--no-verify"]


def test_no_command_mixes_a_list_option_with_a_positional_argument():
    for name, command in commands().items():
        lists = [p for p in command.params if p.param_type_name == "option" and p.multiple]
        positional = [p for p in command.params if p.param_type_name == "argument"]
        assert not (lists and positional), name


def test_an_on_off_flag_says_no_value_type_in_any_help(capsys):
    """A flag's help row shows no `<bool>`: `--html true` is refused, as a flag takes no value."""
    flags = [(name, p.opts[0]) for name, c in command_line().commands.items() for p in c.params
             if getattr(p, "is_flag", False) and not getattr(p, "count", False) and p.opts[0] != "--help"]
    assert ("report", "--html") in flags and ("compare", "--no-verify") in flags
    for name in dict.fromkeys(name for name, _ in flags):
        assert main([name, "--help"]) == 0
        assert "<bool>" not in capsys.readouterr().out, name


def test_every_on_off_flag_parses_alone_and_refuses_a_value():
    """As its help says (no value type): `--html` turns it on, `--html true` is an extra argument."""
    for name, command in command_line().commands.items():
        for param in command.params:
            if not _takes_a_bool(param) or param.opts[0] == "--help":
                continue
            assert param.is_flag, (name, param.opts)  # a bool option that would take `true`
            for flag in (*param.opts, *param.secondary_opts):
                parser = command.make_parser(command.make_context(name, [], resilient_parsing=True))
                values, rest, _ = parser.parse_args([flag])
                assert isinstance(values[param.name], bool) and not rest, (name, flag)
                values, rest, _ = parser.parse_args([flag, "true"])  # "true": left over, or a positional's
                assert isinstance(values[param.name], bool), (name, flag)
                positional = [values.get(p.name) for p in command.params if p.param_type_name == "argument"]
                assert "true" in [*rest, *positional], (name, flag)


def _takes_a_bool(param) -> bool:
    """Whether a parameter's annotation is a bool (or an optional one): typer's own record of it."""
    from typing import get_args

    annotation = getattr(getattr(param, "type_descriptor", None), "annotation", None)
    return annotation is bool or bool in get_args(annotation)


def test_a_warning_is_one_clean_line_without_python_s_source_location():
    """Python prints a warning as `formatwarning` formats it: during a command, one line."""
    import warnings

    from xbench.cli.main import one_line_warnings

    message = "xbench backend 'jax' from my.plugin:Jax is ignored:\n  'jax' is a built-in backend"
    with one_line_warnings():
        text = warnings.formatwarning(message, RuntimeWarning, "registry.py", 97, "return Registry(...)")
    assert text == "warning: xbench backend 'jax' from my.plugin:Jax is ignored: 'jax' is a built-in backend\n"
    assert "registry.py" in warnings.formatwarning(message, RuntimeWarning, "registry.py", 97)  # restored after
    with one_line_warnings():
        text = warnings.formatwarning("plugin " + "x" * 100_000, RuntimeWarning, "registry.py", 97)
    assert len(text) < 600 and text.endswith("(100,007 characters)\n")
