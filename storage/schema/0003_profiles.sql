-- Layer profiles: one row per measured (or catalog-estimated) layer shape on one device kind.
-- The key holds everything that changes a measurement: the model's dimensions (fingerprint), device
-- kind, layer kind, micro-batch size, sequence length, tp, dtype, recompute and the torch version
-- ('' for estimates, which do not depend on torch). Measured and estimated rows for the same shape
-- therefore coexist; readers prefer measured ones.
CREATE TABLE IF NOT EXISTS layer_profiles (
    model_fingerprint VARCHAR NOT NULL,
    device_kind VARCHAR NOT NULL,
    layer_kind VARCHAR NOT NULL,
    micro_batch_size INTEGER NOT NULL,
    seq_len INTEGER NOT NULL,
    tp INTEGER NOT NULL,
    dtype VARCHAR NOT NULL,
    recompute BOOLEAN NOT NULL,
    torch_version VARCHAR NOT NULL,
    model_name VARCHAR,
    forward_s DOUBLE NOT NULL,
    backward_s DOUBLE NOT NULL,
    forward_spread_s DOUBLE NOT NULL DEFAULT 0,
    backward_spread_s DOUBLE NOT NULL DEFAULT 0,
    param_bytes BIGINT NOT NULL,
    activation_bytes BIGINT NOT NULL,
    workspace_bytes BIGINT NOT NULL,
    achieved_flop_per_s DOUBLE,
    estimated BOOLEAN NOT NULL,
    efficiency DOUBLE,
    efficiency_source VARCHAR,
    repeats INTEGER,
    timing_method VARCHAR,
    measured_at TIMESTAMP NOT NULL,
    PRIMARY KEY (model_fingerprint, device_kind, layer_kind, micro_batch_size, seq_len, tp, dtype, recompute, torch_version)
);
