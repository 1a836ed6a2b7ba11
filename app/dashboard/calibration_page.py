"""Calibration page: the profiles on hand, where each prediction comes from (measured, interpolated,
fitted, extrapolated), and a validation report of the simulator against the real engine."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pandas as pd
import streamlit as st

from app.dashboard.tables import readable
from simulator.catalog.hardware import load_hardware
from simulator.catalog.models import catalog_model_ids, load_model
from calibrate.fitting.device import load_cost_model
from simulator.cost.types import Chunk
from simulator.cost.profile_format import Profile
from simulator.cost.shape import ReplicaShape
from simulator.cost.step_timer import step_cost

# This device's profiles (servecast profile writes under the cache), then the measured profiles
# the project ships (profiles/: GPU kernel times among them).
SHIPPED_PROFILES = Path(__file__).resolve().parents[2] / "profiles"
PROFILE_PLACES = (Path.home() / ".cache" / "servecast", SHIPPED_PROFILES)


PROFILE_COLUMNS = {"profile": "Profile file", "hardware": "Accelerator", "device": "Device", "dtype": "Data type",
                   "threads": "Threads", "measurements": "Measurements", "operators": "Measurements by operator"}


@st.cache_data(show_spinner=False)
def profiles_on_hand(places: tuple[str, ...]) -> pd.DataFrame:
    rows = []
    for place in places:
        for path in sorted(Path(place).rglob("*.jsonl"))[:200]:
            try:
                profile = Profile.load(path)
            except (ValueError, OSError):
                continue  # not a profile (or not one this version reads): not listed
            ops = Counter(m.op for m in profile.measurements)
            rows.append({"profile": str(path), "hardware": profile.hardware,
                         "device": profile.fingerprint.get("device_name"), "dtype": profile.fingerprint.get("dtype"),
                         "threads": profile.fingerprint.get("threads"), "measurements": len(profile.measurements),
                         "operators": ", ".join(f"{op} {n}" for op, n in sorted(ops.items()))})
    return pd.DataFrame(rows, columns=list(PROFILE_COLUMNS)).rename(columns=PROFILE_COLUMNS)


def provenance_section() -> None:
    st.header("Where a prediction comes from")
    hardware_ids = [h for h, a in load_hardware().items()]
    models = catalog_model_ids()
    c1, c2, c3 = st.columns(3)
    hardware = c1.selectbox("Hardware", hardware_ids, index=hardware_ids.index("h100-sxm"), key="cal_hw")
    model = c2.selectbox("Model", models, index=models.index("llama-3.1-8b"), key="cal_model")
    profile = c3.text_input("profile (.jsonl, needed for *-local)", "", key="cal_profile").strip() or None
    c4, c5, c6 = st.columns(3)
    batch = int(c4.number_input("decode batch (0: one prefill)", 0, 1024, 16, key="cal_batch"))
    tokens = int(c5.number_input("prefill tokens / decode context", 1, 131072, 1024, key="cal_tokens"))
    tp = int(c6.selectbox("TP", [1, 2, 4, 8], key="cal_tp"))
    try:
        if profile is not None and not Path(profile).is_file():
            raise ValueError(f"no profile at {profile}: give the .jsonl `servecast profile` wrote")
        spec = load_model(model)
        if spec.num_heads % tp:
            raise ValueError(f"TP {tp} does not divide the model's {spec.num_heads} attention heads")
        cost_model = load_cost_model(hardware, profile=profile)
        chunks = [Chunk(1, tokens)] * batch if batch else [Chunk(tokens, tokens)]
        dtype = cost_model.profile.fingerprint.get("dtype", "bf16") if cost_model.profile is not None else "bf16"
        step = step_cost(cost_model, ReplicaShape(spec, tp=tp, dtype=dtype, block_size=None), chunks)
    except ValueError as exc:
        st.error(str(exc))
        return
    table = pd.DataFrame([{"Operator": name, "Time (ms)": t * 1e3, "Share of the step (%)": 100 * t / step.total_s,
                           "Source": step.provenance[name], "Expected error (%)": 100 * step.expected_error[name]}
                          for name, t in sorted(step.by_operator.items(), key=lambda kv: -kv[1])])
    st.metric("step time", f"{step.total_s * 1e3:,.3f} ms")
    st.dataframe(readable(table), hide_index=True,
                 column_config={c: st.column_config.NumberColumn(format="%.1f" if "%" in c else "%.4f")
                                for c in ("Time (ms)", "Share of the step (%)", "Expected error (%)")})
    measured = table.loc[table["Source"].isin(["measured", "interpolated"]), "Share of the step (%)"].sum() / 100
    st.caption(f"{measured:.0%} of this step's time is read from measurements (measured or interpolated); "
               "the rest is fitted or extrapolated from the catalog's roofline and efficiency curves")


def validation_section() -> None:
    st.header("Validation report")
    folder = st.text_input("a `servecast validate --out` folder", "", key="cal_validate").strip()
    if not folder:
        st.caption("Run `servecast validate --out DIR` and give DIR here to see predicted vs measured.")
        return
    errors = Path(folder) / "errors.csv"
    if not errors.is_file():
        st.error(f"no errors.csv in {folder}: give the folder `servecast validate --out` wrote")
        return
    st.dataframe(readable(pd.read_csv(errors)), hide_index=True)
    report = Path(folder) / "report.html"
    if report.is_file():
        st.download_button("report.html", report.read_bytes(), "validation-report.html", "text/html")


def main() -> None:
    st.title("Calibration")
    st.header("Profiles on hand")
    found = profiles_on_hand(tuple(str(p) for p in PROFILE_PLACES if p.is_dir()))
    if found.empty:
        st.info("No profiles under ~/.cache/servecast or profiles/ yet: `servecast profile --out FILE` "
                "measures this device.")
    else:
        st.dataframe(readable(found), hide_index=True)
    provenance_section()
    validation_section()


main()
