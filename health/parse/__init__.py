"""Pure parsers: recorded command output in, typed data out.

Every parser takes the text (and a `source` name for messages) and either returns
frozen dataclasses or raises `trainctl.errors.ParseError` with the source and line.
No parser reads files, runs commands or raises anything else.
"""
