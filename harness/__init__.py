"""What starts the service for tests, the demo and the benchmarks: not part of the served package."""
