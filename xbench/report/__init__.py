"""Results for people: terminal tables (`terminal`), report.md and report.html (`pages`), a
table for pandas (`export`), their shared words (`words`), the bottom line's sentences
(`bottom_line`), `xbench verify`'s table and captions (`verify_text`), the document model
(`document`), and the figures (`plots`) with the drawing kit they share (`drawing`)."""
