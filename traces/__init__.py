"""One trace schema for executed and simulated runs (Chrome trace events), and workload traces."""
