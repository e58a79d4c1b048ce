"""MCP servers of the suite's own, run as subprocesses by tests/test_mcp*.py."""
