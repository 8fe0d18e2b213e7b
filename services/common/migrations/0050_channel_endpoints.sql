-- Webhook endpoints (issue 12): where one provider account delivers over HTTP, with the
-- secret that proves a delivery came from it. The secret is kept as given because the
-- HMAC schemes (LINE, Gitea) need it to recompute signatures; no read RPC returns it.
-- After a rotation the previous secret is accepted until previous_expires_at.
CREATE TABLE awooop_channel_endpoint (
    project_id           VARCHAR(64)  NOT NULL,
    channel_type         VARCHAR(32)  NOT NULL
        CHECK (channel_type IN ('telegram', 'alertmanager', 'gitea', 'line')),
    name                 VARCHAR(64)  NOT NULL,
    secret               TEXT         NOT NULL,
    previous_secret      TEXT,
    previous_expires_at  TIMESTAMPTZ,
    created_by           VARCHAR(128) NOT NULL,
    created_at           TIMESTAMPTZ  NOT NULL DEFAULT now(),
    rotated_at           TIMESTAMPTZ,
    PRIMARY KEY (project_id, channel_type, name)
);
