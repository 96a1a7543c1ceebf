"""The upload that creates a video session: a video file or its frames, as multipart.

POST /v1/videos takes one file part ``video`` (MP4, WebM, MOV, GIF, anything FFmpeg
decodes) or one file part ``frame`` per frame (image files, in order). Every limit is
checked before a frame is decoded: the part count and upload size from the form
(``max_video_frames``, ``max_video_upload_bytes``), a video's frame count and size from its
stream metadata, frame files' sizes from their headers (``max_pixels``), and the decoded
bytes against the session limit (``max_video_session_bytes``) and the decode budget
(``max_decoded_bytes_in_flight``), where they stay reserved until the session holds them.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator, Sequence

import numpy as np
from starlette.datastructures import UploadFile
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect, Request

from sam2serve.engine.video_io import (
    VideoError,
    VideoFormatError,
    VideoFrames,
    VideoLimitError,
    VideoProbe,
    check_frame_sizes,
    decode_video,
    probe_video,
)
from sam2serve.server.decode_budget import (
    RGB_BYTES_PER_PIXEL,
    DecodeBudget,
    Reservation,
    image_decode_bytes,
    video_decode_bytes,
)
from sam2serve.server.errors import ApiError, ClientGone
from sam2serve.server.uploads import decode_image, probe_image
from sam2serve.server.video_sessions import VideoSessions

VIDEO_PART = "video"
FRAME_PART = "frame"
# Enough of an image file for Pillow to read its size (PNG, JPEG, WebP, BMP, TIFF headers).
_HEADER_BYTES = 64 * 1024
_MAX_FIELD_BYTES = 1024 * 1024


class VideoUpload:
    """Reads the upload of a session of ``sessions``, within their limits and
    ``max_pixels``, its decoded bytes reserved in ``decoding``."""

    def __init__(self, sessions: VideoSessions, max_pixels: int, decoding: DecodeBudget) -> None:
        self.sessions = sessions
        self.limits = sessions.limits
        self.max_pixels = max_pixels
        self.decoding = decoding

    async def read(self, request: Request) -> tuple[VideoFrames, Reservation]:
        """The frames of the uploaded video file or frame files, and their bytes reserved
        in the decode budget (release the reservation once the session holds them)."""
        media = request.headers.get("content-type", "").split(";")[0].strip().lower()
        if media != "multipart/form-data":
            raise ApiError(
                415,
                "unsupported_media_type",
                f"Content-Type {media or 'missing'!r} is not accepted here; send "
                f"multipart/form-data with a file part '{VIDEO_PART}' (a video file) or one "
                f"file part '{FRAME_PART}' per frame",
            )
        max_frames = self.limits.max_frames
        try:
            form = await request.form(
                max_files=max_frames + 1, max_fields=0, max_part_size=_MAX_FIELD_BYTES
            )
        except ClientDisconnect:
            raise ClientGone("upload") from None
        except StarletteHTTPException as exc:
            raise ApiError(
                400, "invalid_multipart", f"cannot parse the multipart body: {exc.detail}"
            ) from None
        try:
            unknown = sorted(set(form.keys()) - {VIDEO_PART, FRAME_PART})
            video_parts, frame_parts = form.getlist(VIDEO_PART), form.getlist(FRAME_PART)
            if unknown or bool(video_parts) == bool(frame_parts) or len(video_parts) > 1:
                raise ApiError(
                    400,
                    "invalid_multipart",
                    f"send one file part '{VIDEO_PART}' (a video file) or file parts "
                    f"'{FRAME_PART}' (the frames, in order) - not both, not neither"
                    + (f"; unknown part(s) {', '.join(map(repr, unknown))}" if unknown else ""),
                )
            parts = [part for part in video_parts or frame_parts if isinstance(part, UploadFile)]
            if len(parts) != len(video_parts or frame_parts):
                raise ApiError(400, "invalid_multipart", "the video and frames must be file parts")
            if frame_parts and len(frame_parts) > max_frames:
                raise ApiError(
                    413,
                    "too_many_frames",
                    f"more than {max_frames} frame parts; a session takes at most "
                    f"{max_frames} frames (max_video_frames)",
                )
            uploaded = sum(part.size or 0 for part in parts)
            max_bytes = self.limits.max_upload_bytes
            if max_bytes is not None and uploaded > max_bytes:
                raise ApiError(
                    413,
                    "upload_too_large",
                    f"the upload is {uploaded:,} bytes; the limit is "
                    f"{max_bytes:,} (max_video_upload_bytes)",
                )
            if video_parts:
                return await self._video_file(parts[0])
            return await self._frame_files(parts)
        finally:
            await form.close()

    async def _video_file(self, upload: UploadFile) -> tuple[VideoFrames, Reservation]:
        probe = await asyncio.to_thread(self._probe_video, upload)
        self.sessions.check_frames(probe.frames, probe.height, probe.width)
        reservation = await self.decoding.reserve(
            video_decode_bytes(probe.frames, probe.width, probe.height),
            f"the video ({probe.frames} frames of {probe.width}x{probe.height})",
        )
        try:
            frames = await asyncio.to_thread(self._decode_video, upload, probe)
        except BaseException:
            reservation.release()
            raise
        reservation.shrink(sum(frame.nbytes for frame in frames.frames))
        return frames, reservation

    async def _frame_files(self, parts: Sequence[UploadFile]) -> tuple[VideoFrames, Reservation]:
        sizes = await asyncio.to_thread(self._probe_frames, parts)
        frames_bytes = sum(width * height * RGB_BYTES_PER_PIXEL for width, height in sizes)
        self.sessions.check_frame_bytes(len(parts), frames_bytes)
        largest = max(image_decode_bytes(width, height) for width, height in sizes)
        reservation = await self.decoding.reserve(
            frames_bytes + largest, f"the {len(parts)} frames"
        )
        try:
            frames = await asyncio.to_thread(self._decode_frames, parts)
        except BaseException:
            reservation.release()
            raise
        reservation.shrink(sum(frame.nbytes for frame in frames.frames))
        return frames, reservation

    def _probe_video(self, upload: UploadFile) -> VideoProbe:
        """(In a worker thread.) The uploaded video's size and frame count, nothing decoded."""
        upload.file.seek(0)
        with _video_errors():
            return probe_video(
                upload.file,
                upload.filename or VIDEO_PART,
                max_frames=self.limits.max_frames,
                max_pixels=self.max_pixels,
            )

    def _decode_video(self, upload: UploadFile, probe: VideoProbe) -> VideoFrames:
        upload.file.seek(0)
        with _video_errors():
            return decode_video(
                upload.file,
                upload.filename or VIDEO_PART,
                max_frames=self.limits.max_frames,
                max_pixels=self.max_pixels,
                max_bytes=self.limits.max_bytes,
                probe=probe,
            )

    def _probe_frames(self, parts: Sequence[UploadFile]) -> list[tuple[int, int]]:
        """(In a worker thread.) Each frame file's (width, height) from its header: 413
        past max_pixels; (0, 0) for a file that is no image (decoding it says why)."""
        sizes = []
        for i, part in enumerate(parts):
            part.file.seek(0)
            header = part.file.read(_HEADER_BYTES)
            where = f"{FRAME_PART}[{i}] ({part.filename or f'{FRAME_PART}[{i}]'})"
            size = probe_image(header, self.max_pixels, where)
            if size == (0, 0):  # a header Pillow needs more of: read the whole file
                part.file.seek(0)
                size = probe_image(part.file.read(), self.max_pixels, where)
            sizes.append(size)
        return sizes

    def _decode_frames(self, parts: Sequence[UploadFile]) -> VideoFrames:
        """(In a worker thread.) The frame files decoded, within max_video_session_bytes,
        all of one size."""
        limit = self.limits.max_bytes
        frames: list[np.ndarray] = []
        names: list[str] = []
        held = 0
        for i, part in enumerate(parts):
            part.file.seek(0)
            data = part.file.read()
            name = part.filename or f"{FRAME_PART}[{i}]"
            try:
                frames.append(decode_image(data, self.max_pixels))
            except ApiError as exc:
                raise ApiError(
                    exc.status, exc.code, f"{FRAME_PART}[{i}] ({name}): {exc.message}"
                ) from None
            names.append(name)
            held += frames[-1].nbytes
            if held > limit:
                raise ApiError(
                    413,
                    "video_too_large",
                    f"the first {i + 1} frames already hold {held:,} bytes decoded, over the "
                    f"session limit of {limit:,} (max_video_session_bytes)",
                )
        try:
            check_frame_sizes(frames, names, "the uploaded frames")
        except VideoError as exc:
            raise ApiError(422, "invalid_video", str(exc)) from None
        return VideoFrames(frames=frames, fps=None, names=names, source=f"{len(frames)} frames")


@contextlib.contextmanager
def _video_errors() -> Iterator[None]:
    """VideoLimitError as 413 ``video_too_large``, VideoFormatError (a container or codec
    not taken) as 415 ``unsupported_video``, any other VideoError as 400."""
    try:
        yield
    except VideoFormatError as exc:
        raise ApiError(415, "unsupported_video", str(exc)) from None
    except VideoLimitError as exc:
        raise ApiError(
            413, "video_too_large", f"{exc} (max_video_frames, max_pixels, max_video_session_bytes)"
        ) from None
    except VideoError as exc:
        raise ApiError(
            400, "invalid_video", f"{exc}; send a video FFmpeg can decode (MP4, WebM, MOV, ...)"
        ) from None


__all__ = ["FRAME_PART", "VIDEO_PART", "VideoUpload"]
