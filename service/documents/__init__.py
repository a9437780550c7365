"""Documents: files read into units of text, translated through the one pipeline that
`POST /translate` uses, and written back with everything else left as it was."""
