"""Real-physics robot-arm videos from Meta-World (Sawyer arm, MuJoCo): the same .npz episodes as data/robot/.

    python -m venv /tmp/mwenv --system-site-packages                  # keeps torch; Meta-World pins mujoco 3.3.0
    /tmp/mwenv/bin/pip install -r requirements-metaworld.txt          # GL libraries: see that file
    MUJOCO_GL=egl /tmp/mwenv/bin/python data/metaworld/generate.py    # data/metaworld/push-v3/{train,val,test}/*.npz
    /tmp/mwenv/bin/python data/metaworld/generate.py --env=pick-place-v3 --train=400 --out=data/metaworld/pp
    python train_video.py --data=data/metaworld/push-v3 --init=scratch --mode=multi --out_dir=out/mw

Each file holds `image` (T, H, W, 3) uint8 and `action` (T, 4) float32 (xyz hand displacement and gripper effort in
[-1, 1]; action[t] takes frame t to frame t + 1), as data/robot/prepare.py writes, plus `success` (T,) bool (the
benchmark's own success test for the state shown in frame t) and `noise` (the policy's action noise). Like
prepare.py, the generator writes `action_stats.json` from the train split, so train_video.py and eval.py --task=video read
the directory unchanged.

Policies: Meta-World's scripted expert for the task (metaworld.policies), plus Gaussian action noise of std
NOISE_LEVELS[i % 4] for episode i, so every split mixes graded behaviour: on push-v3 (the default command, 448
episodes) 100 / 98 / 44 / 13% of the episodes at noise 0 / 0.1 / 0.3 / 0.5 reach success at some frame, 89 / 80 /
32 / 11% show it in their last frame (the expert sometimes pushes the puck on past the goal). Each recorded action
is held for --repeat simulator steps (the env's own frame skip of 5 MuJoCo steps each), so 50 recorded frames cover
a whole push. Scenes (object and goal positions) are drawn by the
benchmark's own random reset from a generator seeded by (seed, split): the test scenes are never trained on.

Rendering is offscreen through mujoco.Renderer on the CPU (MUJOCO_GL=egl, or osmesa). Choices, all for speed and
legibility at 64x64: a free camera in front of the table looking at the robot (the built-in corner cameras show the
scene upside down at this size), no shadow map (MuJoCo's default 4096 shadow map made software rendering ~20x
slower), no multisampling and no reflections. The default command took 7.2 min (3.1 min of CPU time, physics
included) on a 2-core machine shared with a training job.
"""
import argparse
import os
import sys
import time
import warnings
from pathlib import Path

import numpy as np

os.environ.setdefault("MUJOCO_GL", "egl")   # before mujoco is imported; osmesa works too
try:
    import mujoco
    from metaworld.env_dict import ALL_V3_ENVIRONMENTS_GOAL_OBSERVABLE as ENVS
    from metaworld.policies import ENV_POLICY_MAP
except ImportError as e:
    sys.exit(f"error: {e}; install Meta-World into its own environment: pip install -r requirements-metaworld.txt")

if __package__ in (None, ""):  # run as a script: make the repository root importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from data.robot.task import write_action_stats  # noqa: E402

DATA_DIR = Path(__file__).resolve().parent
NOISE_LEVELS = (0.0, 0.1, 0.3, 0.5)
SPLIT_IDS = {"train": 0, "val": 1, "test": 2}
CAMERA = dict(azimuth=-90.0, elevation=-45.0, distance=0.65, lookat=(0.0, 0.75, 0.03))   # in front of the table

warnings.filterwarnings("ignore", message="Constant.*too high")   # the scripted experts' gain warning, every step


# -----------------------------------------------------------------------------
# environment and camera

def make_env(name, seed):
    """A Meta-World task with the goal in the observation (the scripted experts read it), whose every reset draws a
    new scene from its own generator seeded by `seed`."""
    key = f"{name}-goal-observable"
    if key not in ENVS or name not in ENV_POLICY_MAP:
        raise ValueError(f"--env {name}: not a Meta-World v3 task with a scripted policy "
                         f"(e.g. {', '.join(sorted(ENV_POLICY_MAP)[:4])}, ...)")
    env = ENVS[key](seed=int(seed))
    env._freeze_rand_vec = False   # a new scene at every reset...
    env.seeded_rand_vec = True     # ...drawn from env.np_random, seeded here
    env.seed(int(seed))
    return env, ENV_POLICY_MAP[name]()


class Camera:
    """Offscreen RGB frames of an env's scene from the free camera CAMERA, at size x size pixels."""

    def __init__(self, env, size):
        env.model.vis.quality.shadowsize = 0   # both must be set before the renderer makes its GL context
        env.model.vis.quality.offsamples = 0
        self.renderer = mujoco.Renderer(env.model, size, size)
        self.cam = mujoco.MjvCamera()
        self.cam.type = mujoco.mjtCamera.mjCAMERA_FREE
        self.cam.azimuth, self.cam.elevation, self.cam.distance = (CAMERA[k] for k in ("azimuth", "elevation",
                                                                                        "distance"))
        self.cam.lookat[:] = CAMERA["lookat"]

    def __call__(self, env):
        mujoco.mj_forward(env.model, env.data)   # positions of sites moved at reset (the goal) without a step yet
        self.renderer.update_scene(env.data, camera=self.cam)
        self.renderer.scene.flags[mujoco.mjtRndFlag.mjRND_REFLECTION] = 0
        return self.renderer.render().copy()

    def close(self):
        self.renderer.close()


# -----------------------------------------------------------------------------
# episodes and splits

def episode(env, policy, camera, rng, length, noise, repeat):
    """Roll out the noisy expert for `length` recorded frames.
    -> dict(image (T, H, W, 3) uint8, action (T, 4) float32, success (T,) bool, noise)."""
    obs, _ = env.reset()
    done = bool(env.evaluate_state(obs, np.zeros(4, np.float32))[1]["success"])
    frames, actions, success = [], [], []
    for t in range(length):
        frames.append(camera(env))
        success.append(done)
        a = policy.get_action(obs) + noise * rng.standard_normal(4)
        a = np.clip(a, -1, 1).astype(np.float32)
        actions.append(a)
        if t < length - 1:             # the last action has no next frame in the episode
            for _ in range(repeat):
                obs, _, _, _, info = env.step(a)
            done = bool(info["success"])
    return dict(image=np.stack(frames), action=np.stack(actions), success=np.array(success, bool),
                noise=np.float32(noise))


def generate_split(out_dir, env_name, split, n, seed=0, length=50, repeat=3, size=64, noise_levels=NOISE_LEVELS):
    """Write n episodes to out_dir/split/00000.npz ... -> share of episodes that reach success (in some frame)."""
    env, policy = make_env(env_name, np.random.SeedSequence([seed, SPLIT_IDS[split]]).generate_state(1)[0])
    folder = Path(out_dir) / split
    folder.mkdir(parents=True, exist_ok=True)
    camera = Camera(env, size)
    rng = np.random.default_rng([seed, SPLIT_IDS[split], 1])    # action noise
    wins = 0
    try:
        for i in range(n):
            ep = episode(env, policy, camera, rng, length, noise_levels[i % len(noise_levels)], repeat)
            np.savez_compressed(folder / f"{i:05d}.npz", **ep)
            wins += bool(ep["success"].any())
    finally:
        camera.close()
        env.close()
    return wins / max(n, 1)


def main(argv=None):
    p = argparse.ArgumentParser(description="write Meta-World robot-arm video episodes (.npz) for train_video.py",
                                allow_abbrev=False)
    p.add_argument("--env", default="push-v3", help="a Meta-World v3 task with a scripted policy")
    p.add_argument("--out", default=None, help="output directory (default: data/metaworld/<env>)")
    # episodes
    p.add_argument("--train", type=int, default=400)
    p.add_argument("--val", type=int, default=16)
    p.add_argument("--test", type=int, default=32)
    p.add_argument("--length", type=int, default=50, help="recorded frames per episode")
    p.add_argument("--repeat", type=int, default=3, help="simulator steps each recorded action is held for")
    p.add_argument("--noise", default=",".join(map(str, NOISE_LEVELS)), help="action noise std per episode, cycled")
    # rendering
    p.add_argument("--size", type=int, default=64, help="frame side in pixels")
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)
    try:
        noise = tuple(float(x) for x in a.noise.split(","))
    except ValueError:
        sys.exit(f"error: --noise {a.noise!r}: expected comma-separated numbers")
    if a.length < 2 or a.repeat < 1 or a.size < 8 or min(noise) < 0:
        sys.exit("error: need --length >= 2, --repeat >= 1, --size >= 8 and --noise >= 0")
    if a.train < 1:
        sys.exit("error: --train must be >= 1 (action_stats.json is computed from the train split)")
    out = Path(a.out or DATA_DIR / a.env)
    for split in ("train", "val", "test"):
        t0 = time.time()
        try:
            rate = generate_split(out, a.env, split, getattr(a, split), a.seed, a.length, a.repeat, a.size, noise)
        except ValueError as e:
            sys.exit(f"error: {e}")
        print(f"wrote {getattr(a, split)} {split} episodes of {a.length} frames to {out / split} "
              f"({rate:.0%} reach success, {time.time() - t0:.0f}s)")
    write_action_stats(out)


if __name__ == "__main__":
    main()
