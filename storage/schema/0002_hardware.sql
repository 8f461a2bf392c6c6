-- Hardware snapshots (stage 1, discover): one per hardware fingerprint, probed or described in a file.
-- Child rows are keyed by the fingerprint plus their natural key and are replaced as a whole on re-save.
CREATE TABLE IF NOT EXISTS hardware_snapshots (
    fingerprint VARCHAR PRIMARY KEY,          -- identity only (planner.measure.discovery / ClusterSpec.fingerprint)
    name VARCHAR NOT NULL,
    source VARCHAR NOT NULL CHECK (source IN ('probe', 'file')),
    backend VARCHAR,                          -- gloo / nccl for probes
    cluster_json JSON NOT NULL,               -- planner.specs.cluster.ClusterSpec
    snapshot_json JSON,                       -- the raw netbench snapshot (probes only)
    created_at TIMESTAMP NOT NULL DEFAULT now()
);

CREATE TABLE IF NOT EXISTS hardware_devices (
    fingerprint VARCHAR NOT NULL,
    node VARCHAR NOT NULL,
    local_index INTEGER NOT NULL,
    rank INTEGER NOT NULL,
    kind VARCHAR NOT NULL,                    -- 'cpu' or a GPU catalog name
    memory_bytes BIGINT NOT NULL,
    peak_flop_per_s DOUBLE NOT NULL,          -- what the planner uses (measured for cpu, datasheet for GPUs)
    measured_flop_per_s DOUBLE,               -- matmul rate measured by discovery (NULL for files)
    matmul_dtype VARCHAR,
    memory_bandwidth_bytes_per_s DOUBLE,      -- measured copy bandwidth (NULL for files)
    PRIMARY KEY (fingerprint, node, local_index)
);

CREATE TABLE IF NOT EXISTS hardware_links (
    fingerprint VARCHAR NOT NULL,
    node VARCHAR NOT NULL,                    -- node group the link belongs to
    link_class VARCHAR NOT NULL CHECK (link_class IN ('intra-node', 'inter-node')),
    kind VARCHAR NOT NULL,
    bandwidth_bytes_per_s DOUBLE NOT NULL,
    latency_s DOUBLE NOT NULL,
    measured BOOLEAN NOT NULL,
    source VARCHAR NOT NULL,
    PRIMARY KEY (fingerprint, node, link_class)
);

CREATE TABLE IF NOT EXISTS hardware_measurements (
    fingerprint VARCHAR NOT NULL,
    op VARCHAR NOT NULL,                      -- send_recv, all_reduce, all_gather, reduce_scatter
    message_bytes BIGINT NOT NULL,
    ranks VARCHAR NOT NULL,                   -- 'src-dst' for a pair, 'all' for a collective
    num_ranks INTEGER NOT NULL,
    link_class VARCHAR NOT NULL,
    time_s DOUBLE NOT NULL,                   -- median of repeats (slowest rank for collectives)
    PRIMARY KEY (fingerprint, op, message_bytes, ranks)
);

CREATE TABLE IF NOT EXISTS hardware_fits (
    fingerprint VARCHAR NOT NULL,
    op VARCHAR NOT NULL,
    link_class VARCHAR NOT NULL,
    alpha_s DOUBLE NOT NULL,
    beta_s_per_byte DOUBLE NOT NULL,
    bandwidth_bytes_per_s DOUBLE,             -- 1/β; NULL when β fitted as 0
    r2 DOUBLE NOT NULL,
    num_points INTEGER NOT NULL,
    PRIMARY KEY (fingerprint, op, link_class)
);

-- Ops a backend lacks, recorded rather than faked.
CREATE TABLE IF NOT EXISTS hardware_unsupported (
    fingerprint VARCHAR NOT NULL,
    op VARCHAR NOT NULL,
    reason VARCHAR NOT NULL,
    PRIMARY KEY (fingerprint, op)
);
