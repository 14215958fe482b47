"""Results for people: terminal tables (`terminal`), report.md and report.html (`pages`), a
table for pandas (`export`), their shared words (`words`), the document model (`document`)
and plots (`plots`)."""
