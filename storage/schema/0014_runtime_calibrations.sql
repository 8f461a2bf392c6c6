-- A runtime's calibrated figures per (device kind, runtime) (planner.cost.runtimes.Figures), fitted by
-- `meshplan calibrate` on measured runs, with their provenance: which runs, from where, and the error
-- before and after. The newest row of a (device_kind, runtime) is the one in force.
CREATE TABLE IF NOT EXISTS runtime_calibrations (
    id VARCHAR PRIMARY KEY,
    device_kind VARCHAR NOT NULL,
    runtime VARCHAR NOT NULL,
    kernel_scale DOUBLE NOT NULL,
    microbatch_s DOUBLE,                      -- NULL: the runtime profile's prior
    runs INTEGER NOT NULL,
    run_ids VARCHAR NOT NULL,                 -- JSON list of the runs it was fitted on
    source VARCHAR NOT NULL,                  -- e.g. "runs.csv" or "meshplan runs (telemetry)"
    mape_before DOUBLE,
    mape_after DOUBLE,
    created_at TIMESTAMP NOT NULL DEFAULT now()
);
