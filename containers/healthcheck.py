"""The image's HEALTHCHECK: GET /health on the configured port; exit 0 when it answers 200.

The slim and CUDA runtime bases carry no curl, and Python is there anyway.
"""

import os
import sys
import urllib.request

port = os.environ.get("INFINITY_SERVER_PORT", "7997")
try:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=3) as response:
        sys.exit(0 if response.status == 200 else 1)
except OSError:
    sys.exit(1)
