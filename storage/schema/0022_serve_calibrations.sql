-- What serving on a device kind paid beyond the kernels (planner.serve.cost.KindServing), fitted by
-- the serve flow from each run's per-request logs (planner.serve.calibrate.fit_serving): one row per
-- (serving run, device kind). serve-plan pools every run's rows of a kind, weighted by `requests`
-- (the requests the figures were measured on), as its cost model's serving figures.
CREATE TABLE IF NOT EXISTS serve_calibrations (
    run_id VARCHAR NOT NULL,
    device_kind VARCHAR NOT NULL,
    front_s DOUBLE NOT NULL,
    reply_s DOUBLE NOT NULL,
    handoff_s DOUBLE NOT NULL,
    tp_serial DOUBLE NOT NULL,
    requests INTEGER NOT NULL,
    created_at TIMESTAMP NOT NULL DEFAULT now(),
    PRIMARY KEY (run_id, device_kind)
);
