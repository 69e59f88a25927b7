#!/bin/sh
# trainctl's quick node checks as slurmd's HealthCheckProgram, Prolog and Epilog: one script for
# all three (the hook tells its role from SLURM_SCRIPT_CONTEXT). Install it on every compute node
# as /etc/slurm/trainctl-slurm-hook.sh (root-owned, mode 755) and add trainctl-slurm-hook.conf's
# lines to slurm.conf. slurmd runs hooks as root with no PATH, and a health check without
# SLURM_CONF (https://slurm.schedmd.com/prolog_epilog.html): both are set here.
PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
export PATH
# Only where slurm.conf is not at Slurm's compiled-in path:
# SLURM_CONF=/etc/slurm/slurm.conf; export SLURM_CONF
exec /usr/local/bin/trainctl health slurm-hook --site /etc/trainctl/site-configs/mysite.toml \
    --budget 8 --state-dir /var/lib/trainctl/slurm-hook --log /var/log/trainctl-slurm-hook.log
