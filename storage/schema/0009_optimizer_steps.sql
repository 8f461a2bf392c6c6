-- Optimizer steps: torch AdamW's step time per (local) parameter, measured over one block of the
-- model on one device kind (worker.profile_layers --optimizer), per parameter layout: "plain", "tp"
-- (DTensors of tensor parallel) and "fsdp" (DTensors sharded by FSDP2), with `num_ranks` ranks of a
-- real group stepping at once (1: one process, DTensors on a fake group). It replaces
-- optimizer_profiles (0008), whose one DTensor figure, timed in one process on a fake group, priced
-- FSDP2's step 1.5-2x below the runs; that table keeps its rows and is no longer read.
-- Readers take the newest measurement (every layout of one run shares its measured_at).
CREATE TABLE IF NOT EXISTS optimizer_steps (
    model_fingerprint VARCHAR NOT NULL,
    device_kind VARCHAR NOT NULL,
    layout VARCHAR NOT NULL,
    num_ranks INTEGER NOT NULL,
    torch_version VARCHAR NOT NULL,
    model_name VARCHAR,
    optimizer VARCHAR NOT NULL DEFAULT 'adamw',
    s_per_param DOUBLE NOT NULL,
    measured_at TIMESTAMP NOT NULL,
    PRIMARY KEY (model_fingerprint, device_kind, layout, num_ranks, torch_version)
);
