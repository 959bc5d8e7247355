"""S3: addresses and credentials (:mod:`.access`), and the S3-compatible server the project starts for its tests,
benchmarks and demo (:mod:`.server`)."""
