"""One module per family of file formats, each a filter over service/documents/base.py."""
