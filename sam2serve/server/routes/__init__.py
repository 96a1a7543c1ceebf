"""The service's endpoints: one module-level router per concern, included by ``create_app``.

- embeddings.py: POST /v1/embeddings (encode and cache an image)
- segment.py: POST /v1/segment (masks for prompts, the interactive path)
- amg.py: POST /v1/amg (automatic mask generation, the bulk path)
- concepts.py: POST /v1/concepts (every instance of a noun phrase, SAM 3; serve --concepts)
- health.py: GET /healthz, /readyz (probes) and /metrics (Prometheus)
- coco.py: POST /v1/coco (masks a client holds -> a COCO file, by the engine's writer)
- images.py: GET /v1/images, /v1/images/file (the server's image folder, serve --images)
- videos.py: /v1/videos (video tracking sessions: upload, read, edit, close)
- video_prompts.py: /v1/videos/{id}/prompts and /propagate (prompts, streamed propagation)
- video_concepts.py: POST /v1/videos/{id}/concepts (SAM 3 on one frame seeds new objects)
- video_concept_tracks.py: POST /v1/videos/{id}/concepts/track (SAM 3's own video
  predictor: a phrase found and tracked through the session's frames, streamed)
- video_frames.py: GET /v1/videos/{id}/frames/{i} (a session's frame as a JPEG, for the page)
- video_export.py: POST /v1/video-export (a video's masks a client holds -> COCO, YouTube-VIS)
- video_live.py: POST /v1/videos/live and WebSocket /v1/videos/{id}/live (live frames)
- page.py: GET / and /page/<asset> (the annotation page: HTML, ES modules, CSS; open, like
  /docs, while the API it calls keeps its key)
- common.py: what the /v1 routes share (router policy, OpenAPI pieces, request steps)

Routes get the app's resources through the dependencies of
:mod:`sam2serve.server.dependencies`, never from an enclosing scope, so the routers exist
once per process and serve any number of apps. Each router carries its own prefix and is
included without one: the paths of its routes are the app's paths.
"""

from __future__ import annotations

from fastapi import APIRouter

from sam2serve.server.routes import (
    amg,
    coco,
    concepts,
    embeddings,
    health,
    images,
    page,
    segment,
    video_concept_tracks,
    video_concepts,
    video_export,
    video_frames,
    video_live,
    video_prompts,
    videos,
)

# In the order the app includes them (their order in the OpenAPI document).
ROUTERS: tuple[APIRouter, ...] = (
    embeddings.router,
    segment.router,
    amg.router,
    concepts.router,
    coco.router,
    images.router,
    videos.router,
    video_prompts.router,
    video_concepts.router,
    video_concept_tracks.router,
    video_frames.router,
    video_export.router,
    video_live.router,
    video_live.ws_router,
    health.router,
    page.router,
)

__all__ = ["ROUTERS"]
