"""Model implementations written for dpgate's runner."""
