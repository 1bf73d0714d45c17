"""Open video decoders, kept for reuse: a read that continues where the previous one of the same file stopped
(the next batch of a sequential reader) decodes on without seeking.

A decoder is checked out by one thread at a time (two threads reading one file get two decoders), the pool holds
at most `capacity` idle ones (least recently used closed first), and a forked child never touches its parent's
decoders: FFmpeg's decoding threads do not survive a fork.
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from fractions import Fraction
from typing import Any

import numpy as np

from app.sources.files import DatasetPath, close_video, open_video

DEFAULT_CAPACITY = 4
UNKNOWN_GOP_FRAMES = 10  # until keyframes have been seen, assume one every so many frames
HAIR_S = 1e-4  # far below any frame interval, far above float32 rounding of a timestamp


class OpenDecoder:
    """One open video file and where its decoding stands: the last frame decoded, and the frames after it.

    `threads` is FFmpeg's decoding thread count (0: FFmpeg picks). A decoder for scattered reads is
    single-threaded: a seek drains and refills FFmpeg's frame-thread pipeline, which made a seek and decode of a
    random frame cost ~45 % more with frame threads (the server decodes requests side by side instead). Runs of
    consecutive frames get the pool's `run_threads`.
    """

    def __init__(self, path: DatasetPath, identity: tuple[int, ...], threads: int = 1) -> None:
        import av  # the server's only video dependency, loaded when a camera is first read

        self.path = path
        self.identity = identity
        self._opened = open_video(path)
        try:
            self.container: Any = av.open(self._opened)
        except BaseException:
            close_video(self._opened)
            raise
        self.stream: Any = self.container.streams.video[0]
        if threads != 1:
            self.stream.thread_type = "AUTO"
        self.stream.codec_context.thread_count = threads
        self.threads = threads
        self.time_base = self.stream.time_base
        self._seconds_per_tick = float(self.time_base)
        # In MP4/MOV a packet's duration is the gap to the next packet's decoding time (the `stts` table), which
        # without frame reordering is the gap to the next frame shown; elsewhere (MKV's default duration, B-frames)
        # it may not be.
        iso_media = "mp4" in self.container.format.name.split(",")
        self._durations_exact = iso_media and not self.stream.codec_context.has_b_frames
        self._frames: Iterator[Any] | None = None  # None: positioned at the start of the file
        self._sought = 0.0  # the time of the last seek (0: decoding from the start of the file)
        self._last: tuple[float, Any] | None = None  # the last frame decoded, and its presentation time
        self._last_keyframe: float | None = None
        self._keyframe_gap: float | None = None  # the shortest distance seen between two keyframes, seconds

    def nearest(self, times: np.ndarray, frame_s: float, keep: Callable[[int, Any], None]) -> np.ndarray:
        """For each of `times` (seconds, ascending), find the frame whose presentation time is nearest (the earlier
        on a tie) and hand it to `keep(position, frame)` as soon as it is known; return those times (NaN where the
        file has no frame at all).

        Positions are handed over in order, so a frame is never handed over again once a later one has been, and
        only the frame just decoded and the one before it are held: memory is bounded by `keep`, not the read.

        Decodes forward through runs of nearby times and seeks across gaps: a time farther past the last frame
        decoded than the file's keyframe interval is reached by a seek to the keyframe before it (decoding through
        the gap would cost more frames than decoding from that keyframe), so a shuffled batch costs a seek and a
        short decode per frame, not a decode of everything between its first and last frame."""
        picked_at = np.full(len(times), np.nan)
        wanted = 0
        retreated = False
        while wanted < len(times):
            if not retreated:
                self._position_for(float(times[wanted]), frame_s)
            retreated = False
            if self._frames is None:
                self._frames = self.container.decode(self.stream)
            previous, exhausted, started = self._last, True, wanted  # a gap ends a pass only after progress
            for frame in self._frames:
                if frame.pts is None:
                    continue
                at = float(Fraction(frame.pts) * self.time_base)
                if previous is None and self._landed_after(at):
                    self._seek(self._sought - self._reach(frame_s))
                    retreated, exhausted = True, False
                    break
                if frame.key_frame:
                    self._saw_keyframe(at)
                while wanted < len(times) and times[wanted] <= at:
                    nearer = previous is not None and times[wanted] - previous[0] <= at - times[wanted]
                    picked_at[wanted], chosen = previous if nearer else (at, frame)  # type: ignore[misc]
                    keep(wanted, chosen)
                    wanted += 1
                settled_within = self._settled_within(frame)
                while wanted < len(times) and times[wanted] - at <= settled_within:
                    picked_at[wanted] = at  # a hair past this frame: the next one cannot be nearer
                    keep(wanted, frame)
                    wanted += 1
                previous = (at, frame)
                if wanted == len(times) or (wanted > started and times[wanted] - at > self._reach(frame_s)):
                    exhausted = False
                    break
            if retreated:
                continue
            self._last = previous
            if exhausted:  # past the last frame: the last frame is nearest
                while wanted < len(times) and previous is not None:
                    picked_at[wanted] = previous[0]
                    keep(wanted, previous[1])
                    wanted += 1
                break
        return picked_at

    def continues_to(self, first: float, frame_s: float) -> bool:
        """Whether a read starting at time `first` is best served by decoding on from here, without a seek."""
        if self._last is None:
            return self._frames is None and first <= self._reach(frame_s)
        return self._last[0] <= first <= self._last[0] + self._reach(frame_s)

    def _reach(self, frame_s: float) -> float:
        """How far ahead decoding on beats a seek: about one keyframe interval (at least two frames)."""
        gap = self._keyframe_gap if self._keyframe_gap is not None else UNKNOWN_GOP_FRAMES * frame_s
        return max(gap, 2 * frame_s) + frame_s / 2

    def _settled_within(self, frame: Any) -> float:
        """How far past `frame` a time may lie and still have it as its nearest frame without decoding the next.

        A timestamp stored as float32 lies up to a few microseconds past its frame as often as before it; deciding
        those by the next frame cost a second decode for half the times, and at LeRobot's GOP of 2 that second frame
        is a keyframe every other time. Where the container's frame durations are exact gaps (MP4 without frame
        reordering, as LeRobot writes), the next frame is presented the frame's duration later, so a time within
        `HAIR_S` of this frame, far below half a duration, is nearer to it. Elsewhere, and without a duration,
        nothing is settled early."""
        duration = frame.duration
        if not self._durations_exact or not duration or duration * self._seconds_per_tick <= 2 * HAIR_S:
            return -1.0
        return HAIR_S

    def _landed_after(self, at: float) -> bool:
        """Whether the first frame after a seek lies past the time sought, so that an earlier frame may be nearer
        (a keyframe found by decoding time can be presented later, in files with B-frames)."""
        return self._sought > 0 and at > self._sought

    def _saw_keyframe(self, at: float) -> None:
        if self._last_keyframe is not None and at > self._last_keyframe:
            gap = at - self._last_keyframe
            self._keyframe_gap = gap if self._keyframe_gap is None else min(self._keyframe_gap, gap)
        self._last_keyframe = at

    def _position_for(self, first: float, frame_s: float) -> None:
        """Keep decoding from here if `first` lies just ahead of the last frame decoded (or near the start of a
        fresh decoder); else seek to the keyframe at or before `first` (a hair past it: a time a hair before a
        keyframe's presentation time, as float32 timestamps often are, still finds that keyframe)."""
        if not self.continues_to(first, frame_s):
            self._seek(first + HAIR_S)

    def _seek(self, target: float) -> None:
        """Position at the keyframe at or before time `target` (the start of the file for a target at or before 0)."""
        self._sought = max(0.0, target)
        self.container.seek(int(self._sought / self.time_base), stream=self.stream, backward=True, any_frame=False)
        self._frames = self.container.decode(self.stream)
        self._last, self._last_keyframe = None, None

    def close(self) -> None:
        self._frames, self._last = None, None
        self.container.close()
        close_video(self._opened)


class DecoderPool:
    """Idle decoders, least recently used first (several of one file when reads of it overlap). Reads of runs of
    consecutive frames get decoders of `run_threads` threads (0: FFmpeg picks), scattered reads single-threaded
    ones."""

    def __init__(self, capacity: int = DEFAULT_CAPACITY, run_threads: int = 1) -> None:
        self.capacity = capacity
        self.run_threads = run_threads
        self.opened = 0  # decoders this process opened (for tests and status)
        self._idle: OrderedDict[int, OpenDecoder] = OrderedDict()  # by id()
        self._lock = threading.Lock()
        self._left_by_parent: list[OpenDecoder] = []
        os.register_at_fork(after_in_child=self._forget_parents)

    @contextmanager
    def checkout(
        self, path: DatasetPath, first: float = 0.0, frame_s: float = 0.1, run: bool = False
    ) -> Iterator[OpenDecoder]:
        """A decoder of `path` for this thread alone, for a read starting at time `first` (`run`: of consecutive
        frames): an idle one of the same file version (one that decodes on to `first` without a seek if there is
        one, else one with the threads the read's kind gets), or a new one. A decoder that raised is closed rather
        than returned (its position is unknown)."""
        identity = _identity(path)
        threads = self.run_threads if run else 1
        decoder = self._take(path, identity, first, frame_s, threads)
        if decoder is None:
            decoder = OpenDecoder(path, identity, threads)
            with self._lock:
                self.opened += 1
        try:
            yield decoder
        except BaseException:
            decoder.close()
            raise
        self._give_back(decoder)

    def clear(self) -> None:
        """Close every idle decoder."""
        with self._lock:
            idle, self._idle = list(self._idle.values()), OrderedDict()
        for decoder in idle:
            decoder.close()

    def _take(
        self, path: DatasetPath, identity: tuple[int, ...], first: float, frame_s: float, threads: int
    ) -> OpenDecoder | None:
        stale: list[OpenDecoder] = []
        with self._lock:
            same_file = [d for d in reversed(self._idle.values()) if d.path == path]
            stale = [d for d in same_file if d.identity != identity]  # the file was rewritten
            current = [d for d in same_file if d.identity == identity]
            continuing = (d for d in current if d.continues_to(first, frame_s))
            alike = (d for d in current if d.threads == threads)
            chosen = next(continuing, None) or next(alike, None)
            for decoder in [*stale, *([chosen] if chosen else [])]:
                del self._idle[id(decoder)]
        for decoder in stale:
            decoder.close()
        return chosen

    def _give_back(self, decoder: OpenDecoder) -> None:
        closing: list[OpenDecoder] = []
        with self._lock:
            self._idle[id(decoder)] = decoder
            while len(self._idle) > self.capacity:
                closing.append(self._idle.popitem(last=False)[1])
        for old in closing:
            old.close()

    def _forget_parents(self) -> None:
        """In a forked child: set the parent's decoders aside unclosed (closing would wait on decoding threads that
        did not survive the fork), and take a fresh lock (the parent's may have been held at the fork)."""
        self._lock = threading.Lock()
        self._left_by_parent.extend(self._idle.values())
        self._idle = OrderedDict()


def _identity(path: DatasetPath) -> tuple[int, ...]:
    """Which version of the file this is (a rewritten file is another decoder)."""
    stat = path.stat()
    return (stat.st_ino, stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns)
