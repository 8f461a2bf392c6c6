-- Runs of meshplan flows and the config each used (every later table can point at a run).
CREATE TABLE IF NOT EXISTS configs (
    fingerprint VARCHAR PRIMARY KEY,
    config_json JSON NOT NULL,
    created_at TIMESTAMP DEFAULT now()
);
