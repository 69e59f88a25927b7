"""Files admins install beside Slurm and systemd: the HealthCheckProgram/Prolog hook and the
nightly sweep's units. Shipped as package data; `trainctl contrib` lists and prints them."""
