"""Media from URLs, data URIs and uploads, fetched within bounds.

- `addresses`: which addresses a URL may point at (public ones only, IPv4 embedded in IPv6 judged
  by what it embeds);
- `client`: fetching, with the address pinned between the check and the connection, redirects
  checked the same way, and one shared HTTP client per server;
- `limits`: the server-wide fetch slots, the bytes held at once, and bounded decompression.
"""

from infinity_server.fetch.client import (
    FetchPolicy,
    MediaFetcher,
    close_media_client,
    media_client,
    shared_media_client,
)
from infinity_server.fetch.limits import FetchGate

__all__ = ["FetchGate", "FetchPolicy", "MediaFetcher", "close_media_client", "media_client", "shared_media_client"]
