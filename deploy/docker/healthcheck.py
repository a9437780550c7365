"""Docker HEALTHCHECK: exit 0 when GET /health answers 200, else 1. Standard library only (the
image has no curl). Reads MT_PORT like the service; MT_HEALTH_URL overrides the whole URL."""

import os
import sys
import urllib.request

port = os.environ.get("MT_PORT", "8000")
url = os.environ.get("MT_HEALTH_URL") or f"http://127.0.0.1:{port}/health"
try:
    with urllib.request.urlopen(url, timeout=3) as response:
        sys.exit(0 if response.status == 200 else 1)
except Exception as e:  # any failure (refused, timeout, HTTP error) is "unhealthy"
    print(f"unhealthy: {url}: {e}", file=sys.stderr)
    sys.exit(1)
