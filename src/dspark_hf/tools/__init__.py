"""Tools built on the core and the formats: the `dspark` CLI, bench, calibrate, demo, training, default pair."""
