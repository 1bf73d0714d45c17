"""Robot-camera content: the ALOHA insertion scene (gym-aloha's MuJoCo model, from which LeRobot's aloha_sim datasets
were rendered) seen from its 'top' camera while both arms reach in and out along smooth sinusoids.

Rendering is slow on a software renderer (about 0.2 s a 480x640 frame), so a loop of `LOOP_FRAMES` frames is
rendered once, headless (`MUJOCO_GL=egl` unless set otherwise), in a subprocess, and cached as a zstd-compressed
Arrow IPC file named for its render parameters; later runs read the frames from it. The loop is periodic, so the
recording plays through it without a jump: episodes starting at different frames see different parts of the
motion. Other sizes are the same frames downscaled (bilinear, antialiased), so every size shows the same scene.

    python -m bench.aloha_scene OUT.arrow    (renders the loop into OUT.arrow; the scene runs this itself)
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pyarrow as pa

LOOP_FRAMES = 360  # 12 s at 30 fps
RENDER_HEIGHT, RENDER_WIDTH = 480, 640
CAMERA = "top"
_MOTION = 1  # the version of `joint_positions`: a changed motion renders (and caches) anew
_OBJECTS_SEED = 0  # where the peg and the socket lie (gym-aloha's own sampler)
_PACKAGES = ("gym-aloha", "mujoco", "dm-control")
_REPOSITORY = Path(__file__).resolve().parents[1]
_FAILED: dict[Path, str] = {}  # cache file -> why rendering it failed in this process (not tried again)


class SceneUnavailable(RuntimeError):
    """The scene cannot be rendered here (a package or the headless GL missing); the message says why."""


def render_parameters() -> dict[str, object]:
    """Everything the cached frames depend on: a change in any renders them again."""
    versions = {name: importlib.metadata.version(name) for name in _PACKAGES}
    return {
        "task": "insertion",
        "camera": CAMERA,
        "height": RENDER_HEIGHT,
        "width": RENDER_WIDTH,
        "frames": LOOP_FRAMES,
        "motion": _MOTION,
        "objects_seed": _OBJECTS_SEED,
        "versions": versions,
    }


def joint_positions(i: int) -> np.ndarray:
    """The 16 arm joints (per arm: waist, shoulder, elbow, forearm roll, wrist angle, wrist rotate, two fingers) at
    frame `i`: each arm reaches towards the table and back, swings its waist and opens and closes its gripper, on
    periods that divide the loop, the two arms out of step."""
    from gym_aloha.constants import START_ARM_POSE

    t = 2 * np.pi * (i % LOOP_FRAMES) / LOOP_FRAMES
    pose = np.array(START_ARM_POSE, dtype=np.float64)
    for arm, (phase, swing) in enumerate(((0.0, 1), (2.1, 2))):
        reach = 0.5 - 0.5 * np.cos(2 * t + phase)  # 0 at rest, 1 reaching to the table
        grip = 0.5 + 0.5 * np.cos(3 * t + phase)  # 1 open, 0 closed
        finger = 0.021 + 0.036 * grip
        base = 8 * arm
        pose[base : base + 8] += [
            0.3 * np.sin(swing * t + phase),  # waist
            0.85 * reach,  # shoulder: forwards and down
            -0.55 * reach,  # elbow: stretched
            0.3 * np.sin(t + phase),  # forearm roll
            0.45 * reach - 0.2 * np.sin(3 * t),  # wrist angle: pointing down to the table
            0.9 * np.sin(t - phase),  # wrist rotate
            0.0,
            0.0,
        ]
        pose[base + 6], pose[base + 7] = finger, -finger
    return pose


def _render(out: Path) -> None:
    """Render the loop into `out` (atomically: a temporary file renamed into place), one record batch a frame."""
    os.environ.setdefault("MUJOCO_GL", "egl")
    from dm_control import mujoco
    from gym_aloha.constants import ASSETS_DIR
    from gym_aloha.utils import sample_insertion_pose

    physics = mujoco.Physics.from_xml_path(str(ASSETS_DIR / "bimanual_viperx_insertion.xml"))
    objects = np.concatenate(sample_insertion_pose(_OBJECTS_SEED))
    schema = pa.schema([pa.field("rgb", pa.binary())], metadata={"parameters": json.dumps(render_parameters())})
    options = pa.ipc.IpcWriteOptions(compression="zstd")
    partial = out.with_suffix(f".{os.getpid()}.partial")
    started = time.perf_counter()
    try:
        with pa.ipc.new_file(partial, schema, options=options) as writer:
            for i in range(LOOP_FRAMES):
                physics.named.data.qpos[:16] = joint_positions(i)
                physics.named.data.qpos[-14:] = objects
                physics.forward()  # kinematics only: the scene is posed, not simulated
                pixels = physics.render(height=RENDER_HEIGHT, width=RENDER_WIDTH, camera_id=CAMERA)
                writer.write_batch(pa.record_batch([pa.array([pixels.tobytes()], pa.binary())], schema=schema))
        partial.rename(out)
    finally:
        partial.unlink(missing_ok=True)
    seconds = time.perf_counter() - started
    print(f"rendered {LOOP_FRAMES} frames in {seconds:.0f} s ({seconds / LOOP_FRAMES:.3f} s a frame)", file=sys.stderr)


def rendered_loop(cache_dir: Path) -> Path:
    """The cached loop for the current render parameters, rendered first unless it is there."""
    missing = [name for name in ("gym_aloha", "mujoco", "dm_control") if importlib.util.find_spec(name) is None]
    if missing:
        raise SceneUnavailable(f"{', '.join(missing)} not installed (see bench/requirements.txt)")
    digest = hashlib.sha256(json.dumps(render_parameters(), sort_keys=True).encode()).hexdigest()[:12]
    path = cache_dir / f"aloha-insertion-{CAMERA}-{RENDER_HEIGHT}x{RENDER_WIDTH}-{digest}.arrow"
    if path.is_file():
        return path
    if path in _FAILED:
        raise SceneUnavailable(_FAILED[path])
    cache_dir.mkdir(parents=True, exist_ok=True)
    print(f"# rendering the ALOHA scene ({LOOP_FRAMES} frames, cached in {path}) ...", file=sys.stderr)
    env = {**os.environ, "MUJOCO_GL": os.environ.get("MUJOCO_GL", "egl")}
    command = [sys.executable, "-m", "bench.aloha_scene", str(path)]
    done = subprocess.run(command, cwd=_REPOSITORY, env=env, stderr=subprocess.PIPE, text=True)
    if done.returncode != 0 or not path.is_file():
        last = (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[-1]
        _FAILED[path] = f"rendering with MUJOCO_GL={env['MUJOCO_GL']} failed: {last.rstrip('.')}"
        raise SceneUnavailable(_FAILED[path])
    print(f"# {done.stderr.strip().splitlines()[-1]}", file=sys.stderr)
    return path


class AlohaScene:
    """The camera's view: frame `i` of the whole recording (episodes follow each other without a cut), `height` x
    `width`, read from the cached loop."""

    def __init__(self, height: int, width: int, cache_dir: Path) -> None:
        self.height, self.width = height, width
        self._reader = pa.ipc.open_file(pa.memory_map(str(rendered_loop(cache_dir))))
        self._lock = threading.Lock()  # the encoders ask for frames from several threads

    def frame(self, i: int) -> np.ndarray:
        with self._lock:
            rgb = self._reader.get_batch(i % LOOP_FRAMES).column(0)[0].as_py()
        pixels = np.frombuffer(rgb, dtype=np.uint8).reshape(RENDER_HEIGHT, RENDER_WIDTH, 3)
        if (self.height, self.width) == (RENDER_HEIGHT, RENDER_WIDTH):
            return pixels.copy()
        from PIL import Image

        return np.asarray(Image.fromarray(pixels).resize((self.width, self.height), Image.Resampling.BILINEAR))


if __name__ == "__main__":
    _render(Path(sys.argv[1]))
