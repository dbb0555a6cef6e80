"""Band policies and the request geometry: the page formulas of each band kind, shared by the
request layer, admission, the prefix cache and capacity planning."""
