-- name: CreateEndpoint
-- params: project_id, channel, name, secret, created_by
-- A new webhook endpoint; nothing (no row) when one of that name exists. Answers the columns
-- an endpoint is shown with (never a secret): previous_expires_at only while the previous
-- secret is still valid.
INSERT INTO awooop_channel_endpoint (project_id, channel_type, name, secret, created_by)
VALUES ($1, $2, $3, $4, $5)
ON CONFLICT (project_id, channel_type, name) DO NOTHING
RETURNING project_id, channel_type, name, created_at, rotated_at,
       CASE WHEN previous_expires_at > now() THEN previous_expires_at END AS previous_expires_at

-- name: ListEndpoints
-- params: project_id
-- A project's endpoints, as CreateEndpoint answers them.
SELECT project_id, channel_type, name, created_at, rotated_at,
       CASE WHEN previous_expires_at > now() THEN previous_expires_at END AS previous_expires_at
  FROM awooop_channel_endpoint
 WHERE project_id = $1
 ORDER BY channel_type, name

-- name: RotateEndpoint
-- params: grace, secret, project_id, channel, name
-- One statement: the current secret becomes the previous one until now() + :grace seconds.
UPDATE awooop_channel_endpoint
   SET previous_secret = secret, previous_expires_at = now() + make_interval(secs => $1),
       secret = $2, rotated_at = now()
 WHERE project_id = $3 AND channel_type = $4 AND name = $5
RETURNING project_id, channel_type, name, created_at, rotated_at, previous_expires_at

-- name: RemoveEndpoint
-- params: project_id, channel, name
DELETE FROM awooop_channel_endpoint WHERE project_id = $1 AND channel_type = $2 AND name = $3

-- name: EndpointSecrets
-- params: project_id, channel, name
-- What verification needs: the secrets valid now, and for how long the previous one still is.
SELECT secret,
       CASE WHEN previous_expires_at > now() THEN previous_secret END AS previous_secret,
       extract(epoch FROM previous_expires_at - now())::float8 AS previous_left
  FROM awooop_channel_endpoint
 WHERE project_id = $1 AND channel_type = $2 AND name = $3
