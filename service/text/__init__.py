"""Text in and out: limits, sentence splitting and reassembly, shared by HTTP and the CLI."""
