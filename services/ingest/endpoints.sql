-- name: CreateEndpoint :one
-- A new webhook endpoint; nothing (no row) when one of that name exists. Answers the columns
-- an endpoint is shown with (never a secret): previous_expires_at only while the previous
-- secret is still valid.
INSERT INTO awooop_channel_endpoint (project_id, channel_type, name, secret, created_by)
VALUES (:project_id, :channel, :name, :secret, :created_by)
ON CONFLICT (project_id, channel_type, name) DO NOTHING
RETURNING project_id, channel_type, name, created_at, rotated_at,
       CASE WHEN previous_expires_at > now() THEN previous_expires_at END AS previous_expires_at

-- name: ListEndpoints :many
-- A project's endpoints, as CreateEndpoint answers them.
SELECT project_id, channel_type, name, created_at, rotated_at,
       CASE WHEN previous_expires_at > now() THEN previous_expires_at END AS previous_expires_at
  FROM awooop_channel_endpoint
 WHERE project_id = :project_id
 ORDER BY channel_type, name

-- name: RotateEndpoint :one
-- One statement: the current secret becomes the previous one until now() + :grace seconds.
UPDATE awooop_channel_endpoint
   SET previous_secret = secret, previous_expires_at = now() + make_interval(secs => :grace),
       secret = :secret, rotated_at = now()
 WHERE project_id = :project_id AND channel_type = :channel AND name = :name
RETURNING project_id, channel_type, name, created_at, rotated_at, previous_expires_at

-- name: RemoveEndpoint :exec
DELETE FROM awooop_channel_endpoint WHERE project_id = :project_id AND channel_type = :channel AND name = :name

-- name: EndpointSecrets :one
-- What verification needs: the secrets valid now, and for how long the previous one still is.
SELECT secret,
       CASE WHEN previous_expires_at > now() THEN previous_secret END AS previous_secret,
       extract(epoch FROM previous_expires_at - now())::float8 AS previous_left
  FROM awooop_channel_endpoint
 WHERE project_id = :project_id AND channel_type = :channel AND name = :name
