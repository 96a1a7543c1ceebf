"""A Label Studio ML backend over the service: interactive pre-annotation (clicks and boxes
-> brush masks; keyframe boxes on a video -> tracked VideoRectangles) and pre-annotation of
whole projects (docs/labelling.md, "Label Studio").

- :mod:`options`       what the backend needs beyond the service's settings (torch-free)
- :mod:`protocol`      the bodies Label Studio sends and the answers it reads
- :mod:`label_config`  the project's labelling config: which tags are read and written
- :mod:`context`       the annotator's clicks and box as one SAM prompt (percent -> pixels)
- :mod:`brush`         masks in Label Studio's brush RLE
- :mod:`images`        a task's image from its URL, Label Studio path, data URI or local path
- :mod:`video_context` the annotator's VideoRectangle keyframes as one prompt per object
- :mod:`video_frames`  a video task's frames from the first keyframe on (PyAV, bounded)
- :mod:`video_result`  tracked boxes as Label Studio's VideoRectangle keyframes
- :mod:`video_predict` a video task tracked on the service's video model
- :mod:`predict`       the requests' flow on the service's engine (cache, batching, limits)
- :mod:`routes`        the endpoints (/health, /setup, /predict, /versions, /webhook)
- :mod:`app`           ``create_labelstudio_app``: the service's app plus those endpoints
"""
