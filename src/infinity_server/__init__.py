"""infinity-server: the HTTP edge over model_registry."""
