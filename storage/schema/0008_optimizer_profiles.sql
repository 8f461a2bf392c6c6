-- Optimizer profiles: torch AdamW's step time per (local) parameter, measured over one block of the
-- model on one device kind (worker.profile_layers --optimizer), with plain and with DTensor parameters
-- (as under tensor parallel / FSDP2, where every per-tensor op dispatches through DTensor). The key
-- holds everything that changes the measurement: the model's dimensions (fingerprint; tensor sizes
-- decide what stays in cache), device kind, DTensor or not, and the torch version. Readers take the
-- newest measurement across torch versions.
CREATE TABLE IF NOT EXISTS optimizer_profiles (
    model_fingerprint VARCHAR NOT NULL,
    device_kind VARCHAR NOT NULL,
    dtensor BOOLEAN NOT NULL,
    torch_version VARCHAR NOT NULL,
    model_name VARCHAR,
    optimizer VARCHAR NOT NULL DEFAULT 'adamw',
    s_per_param DOUBLE NOT NULL,
    measured_at TIMESTAMP NOT NULL,
    PRIMARY KEY (model_fingerprint, device_kind, dtensor, torch_version)
);
