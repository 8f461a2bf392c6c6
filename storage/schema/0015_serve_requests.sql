-- Serving (issue #29): every request `meshplan serve` answered, dropped or failed, with its latency
-- measured at the HTTP front end (arrival to reply). `phase` is 'warmup' for the calibration
-- requests sent before a replay, else 'serve'; latency_s is NULL for a dropped request.
CREATE TABLE IF NOT EXISTS serve_requests (
    run_id VARCHAR NOT NULL,
    request_id BIGINT NOT NULL,
    model VARCHAR NOT NULL,
    grp INTEGER,
    phase VARCHAR NOT NULL,
    arrival_s DOUBLE NOT NULL,
    latency_s DOUBLE,
    status VARCHAR NOT NULL,
    slo_s DOUBLE,
    recorded_at TIMESTAMP DEFAULT now(),
    PRIMARY KEY (run_id, request_id)
);
