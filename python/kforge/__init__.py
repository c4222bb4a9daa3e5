"""kforge Python client: load kforge sparse MLA modules and launch them."""
