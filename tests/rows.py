"""Row filters the sampled legal => correct tests share."""


def without_clusters(row) -> bool:
    """Rows no thread-block cluster shares (REDUCE=cluster:C). The fast sampled tests leave
    those to tests/cuda/test_cluster_reduce.py, which samples them on their own: a cluster's C
    blocks run together on the emulator, C times the threads of the same row without one, and
    they are a third or more of a long row kernel's legal rows. The slow full sweeps
    (`-m slow`) sample every legal row."""
    return not row.get("REDUCE", "").startswith("cluster:")
