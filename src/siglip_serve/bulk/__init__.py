"""Bulk embedding on Ray Data: the service's towers and artifacts over a folder, a list or a table."""
