"""What runs a loaded model: leases and lazy loads, eviction in a memory budget, each model's
queue, prepare threads and worker, admission by deadline, warm-up and stage timing."""
