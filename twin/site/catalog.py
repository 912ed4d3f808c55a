"""Hardware catalog: per-model defaults for GPUs, nodes and CDUs.

Every number is a prior from ``docs/physics.md`` (section numbers in the comments) and is
overridden by per-device calibration. Confidence tags follow docs/physics.md: H primary source,
M secondary or derived, L assumption.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class GpuModel(BaseModel):
    """Defaults for one GPU model."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    tdp_w: float = Field(gt=0, description="default (maximum) power limit [W]")
    min_power_limit_w: float = Field(gt=0, description="lowest settable power cap [W]")
    idle_w: float = Field(gt=0, description="idle draw [W]")
    gamma: float = Field(gt=0, description="power-curve exponent, P = Pi + (Pl-Pi) a^gamma")
    max_operating_temp_c: float
    slowdown_temp_c: float
    shutdown_temp_c: float
    hbm_max_temp_c: float
    r_liquid_k_per_w: float = Field(gt=0, description="GPU-to-coolant thermal resistance [K/W]")
    r_air_k_per_w: float = Field(gt=0, description="GPU-to-inlet-air thermal resistance [K/W]")
    tau_liquid_s: float = Field(gt=0, description="thermal time constant on a cold plate [s]")
    tau_air_s: float = Field(gt=0, description="thermal time constant on an air heat sink [s]")
    sm_clock_max_mhz: float = Field(gt=0)
    mem_clock_mhz: float = Field(gt=0)


class NodeModel(BaseModel):
    """Defaults for one server (or tray) model."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    gpu: str = Field(description="GpuModel key")
    gpus: int = Field(gt=0)
    max_power_w: float = Field(gt=0, description="nameplate maximum input power [W]")
    base_w: float = Field(ge=0, description="non-GPU load at idle (CPUs, NICs, fans) [W]")
    gpu_overhead_frac: float = Field(
        ge=0, description="non-GPU load that scales with GPU power, b in a + b*sum(P_gpu)"
    )
    cooling: Literal["liquid", "air"]
    capture_fraction: float = Field(ge=0, le=1, description="share of node heat to liquid")


class CduModel(BaseModel):
    """Defaults for one CDU model."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    capacity_kw: float = Field(gt=0)
    approach_k: float = Field(gt=0)
    max_flow_lpm: float = Field(gt=0)
    pumps: int = Field(gt=0)
    design_dp_kpa: float = Field(gt=0)


# Hopper thresholds: nvidia-smi -q of a 700 W Hopper SXM5 (docs/physics.md §2.1, H); H200 assumed
# the same die (§2.1, L). Blackwell thresholds not published: Hopper values as placeholders
# (§9.1, L).
_HOPPER_THERMAL = dict(
    max_operating_temp_c=87.0, slowdown_temp_c=89.0, shutdown_temp_c=92.0, hbm_max_temp_c=95.0
)

GPU_MODELS: dict[str, GpuModel] = {
    "H100-SXM": GpuModel(
        name="NVIDIA H100 SXM5 80GB",
        tdp_w=700.0,  # docs/physics.md §1.1, nvidia-smi Max Power Limit (H)
        min_power_limit_w=200.0,  # §1.1, nvidia-smi Min Power Limit (H)
        idle_w=70.0,  # §1.2/§9.1, measured 64-75 W (H)
        gamma=1.0,  # §9.1, RAPS linear model (H), fit 0.7-1
        **_HOPPER_THERMAL,
        r_liquid_k_per_w=0.03,  # §9.2 cold plate 0.02-0.05 (M)
        r_air_k_per_w=0.07,  # §9.2 air heat sink (L)
        tau_liquid_s=10.0,  # §9.2 cold plate + package 5-20 s (D/L)
        tau_air_s=60.0,  # §9.2 air heat sink 30-90 s (D/L)
        sm_clock_max_mhz=1980.0,  # H100 SXM boost clock, NVIDIA datasheet (M)
        mem_clock_mhz=2619.0,  # H100 SXM HBM3 clock as reported by nvidia-smi (M)
    ),
    "H200-SXM": GpuModel(
        name="NVIDIA H200 SXM 141GB",
        tdp_w=700.0,  # §1.1 (S)
        min_power_limit_w=200.0,  # §9.1 assumed as H100 (L)
        idle_w=75.0,  # §9.1 ~10 % of TDP (L)
        gamma=1.0,  # §9.1
        **_HOPPER_THERMAL,
        r_liquid_k_per_w=0.03,  # §9.2 (M)
        r_air_k_per_w=0.07,  # §9.2 (L)
        tau_liquid_s=10.0,  # §9.2 (D/L)
        tau_air_s=60.0,  # §9.2 (D/L)
        sm_clock_max_mhz=1980.0,  # same GH100 die as H100 (M)
        mem_clock_mhz=3201.0,  # HBM3e (M)
    ),
    "B200": GpuModel(
        name="NVIDIA B200 (HGX)",
        tdp_w=1000.0,  # §1.1 "configurable up to 1 kW" (S)
        min_power_limit_w=200.0,  # not found; Hopper value as placeholder (L)
        idle_w=100.0,  # §9.1 ~10 % of TDP (L)
        gamma=1.0,  # §9.1
        **_HOPPER_THERMAL,
        r_liquid_k_per_w=0.03,  # §9.2 (M)
        r_air_k_per_w=0.07,  # §9.2 (L)
        tau_liquid_s=10.0,  # §9.2 (D/L)
        tau_air_s=60.0,  # §9.2 (D/L)
        sm_clock_max_mhz=1965.0,  # B200 boost clock (S)
        mem_clock_mhz=3996.0,  # HBM3e (S)
    ),
    "GB200": GpuModel(
        name="NVIDIA B200 in GB200 NVL72",
        tdp_w=1200.0,  # §1.1 ~1,200 W per GPU in GB200 (S)
        min_power_limit_w=200.0,  # not found (L)
        idle_w=120.0,  # §9.1 ~10 % of TDP (L)
        gamma=1.0,  # §9.1
        **_HOPPER_THERMAL,
        r_liquid_k_per_w=0.03,  # §2.2 Kenfa GB200 cold plate target < 0.03 K/W (S)
        r_air_k_per_w=0.07,  # not air-cooled in practice (L)
        tau_liquid_s=10.0,  # §9.2 (D/L)
        tau_air_s=60.0,  # §9.2 (D/L)
        sm_clock_max_mhz=1965.0,  # (S)
        mem_clock_mhz=3996.0,  # (S)
    ),
    "RTX4090": GpuModel(
        name="NVIDIA GeForce RTX 4090",
        tdp_w=450.0,  # §9.1 NVIDIA RTX 4090 spec page, Total Graphics Power 450 W (H)
        min_power_limit_w=150.0,  # not on the spec page (L)
        idle_w=33.0,  # §9.1 33 W at 0 % GPU-Util in the reference nvidia-smi log (M)
        gamma=1.0,  # §9.1
        max_operating_temp_c=90.0,  # §9.1 spec page, Maximum GPU Temperature 90 °C (H)
        slowdown_temp_c=93.0,  # not published; above the maximum (L)
        shutdown_temp_c=96.0,  # not published (L)
        hbm_max_temp_c=105.0,  # GDDR6X, no HBM: memory junction limit assumed (L)
        r_liquid_k_per_w=0.03,  # §9.2 (L): sold air-cooled
        r_air_k_per_w=0.1,  # §9.2 air heat sink, a 450 W card at ~45 K over inlet (L)
        tau_liquid_s=10.0,  # §9.2 (D/L)
        tau_air_s=60.0,  # §9.2 (D/L)
        sm_clock_max_mhz=2520.0,  # spec page, boost clock 2.52 GHz (H)
        mem_clock_mhz=10501.0,  # 21 Gbps GDDR6X as nvidia-smi reports it (M)
    ),
    "A100-SXM4-40GB": GpuModel(
        name="NVIDIA A100-SXM4-40GB",
        tdp_w=400.0,  # NVIDIA A100 Tensor Core GPU datasheet: SXM max TDP 400 W; §1.1 (H)
        min_power_limit_w=100.0,  # §1.1, nvidia-smi Min Power Limit of A100 SXM (H)
        idle_w=52.0,  # §1.2, nvidia-smi of a 400 W A100 SXM (H); 55-60 W in real_traces
        gamma=1.0,  # §9.1
        # §2.1 nvidia-smi -q of A100 SXM parts: max operating (target) 85, slowdown 89,
        # shutdown 92, HBM 95 °C (H); the datasheet gives no die limits
        max_operating_temp_c=85.0,
        slowdown_temp_c=89.0,
        shutdown_temp_c=92.0,
        hbm_max_temp_c=95.0,
        r_liquid_k_per_w=0.03,  # §9.2 cold plate (M)
        r_air_k_per_w=0.07,  # §9.2 air heat sink (L)
        tau_liquid_s=10.0,  # §9.2 (D/L)
        tau_air_s=60.0,  # §9.2 (D/L)
        sm_clock_max_mhz=1410.0,  # A100 datasheet boost clock; 1410 MHz in real_traces (H)
        mem_clock_mhz=1215.0,  # HBM2 clock as nvidia-smi reports it (the real_traces, H)
    ),
}

NODE_MODELS: dict[str, NodeModel] = {
    "HGX-H100-8": NodeModel(
        name="HGX/DGX H100 8-GPU",
        gpu="H100-SXM",
        gpus=8,
        max_power_w=10200.0,  # §1.4 DGX H100 10.2 kW max (H)
        base_w=1200.0,  # §9.1 RAPS-style CPUs, DRAM, NICs, NVMe idle (H for Frontier, L here)
        gpu_overhead_frac=0.25,  # fans/NVSwitch/PSU share; 10.2 kW - 5.6 kW at max (§1.4, D)
        cooling="air",
        capture_fraction=0.0,  # air-cooled: no liquid capture
    ),
    "HGX-H200-8-DLC": NodeModel(
        name="HGX H200 8-GPU, direct liquid cooled",
        gpu="H200-SXM",
        gpus=8,
        max_power_w=10200.0,  # §1.4 DGX H200 10.2 kW max (H)
        base_w=1200.0,  # §9.1 (L)
        gpu_overhead_frac=0.25,  # §1.4 (D)
        cooling="liquid",
        capture_fraction=0.75,  # §9.4 HGX DLC retrofit 0.6-0.8 (M)
    ),
    "DGX-B200": NodeModel(
        name="DGX B200 8-GPU",
        gpu="B200",
        gpus=8,
        max_power_w=14300.0,  # §1.4 DGX B200 14.3 kW max (H)
        base_w=1500.0,  # §9.1 (L)
        gpu_overhead_frac=0.25,  # (D/L)
        cooling="liquid",
        capture_fraction=0.75,  # §9.4 (M)
    ),
    "GB200-NVL72-TRAY": NodeModel(
        name="GB200 NVL72 compute tray (2 superchips, 4 GPUs)",
        gpu="GB200",
        gpus=4,
        max_power_w=6500.0,  # §1.4 compute tray ~6.5 kW (S)
        base_w=600.0,  # 2 Grace CPUs, NICs; §1.4 tray minus 4 x 1.2 kW, at idle (L)
        gpu_overhead_frac=0.15,  # (L)
        cooling="liquid",
        capture_fraction=0.90,  # §9.4 GB200 NVL72 full DLC 0.85-0.95 (M)
    ),
    "WS-RTX4090-1": NodeModel(
        name="workstation with one GeForce RTX 4090",
        gpu="RTX4090",
        gpus=1,
        max_power_w=850.0,  # §9.1 spec page, Required System Power 850 W (H)
        base_w=80.0,  # desktop CPU, board and fans at idle (L)
        gpu_overhead_frac=0.10,  # fans and VRM share (L)
        cooling="air",
        capture_fraction=0.0,  # air-cooled: no liquid capture
    ),
    "A100-SXM4-1": NodeModel(
        name="one A100-SXM4-40GB of an air-cooled cloud host (the real_traces recordings)",
        gpu="A100-SXM4-40GB",
        gpus=1,
        max_power_w=700.0,  # the GPU's 400 W and a share of the host (L)
        base_w=150.0,  # a share of the host's CPUs, DRAM, NICs at idle (L)
        gpu_overhead_frac=0.25,  # as HGX (§1.4, D/L)
        cooling="air",
        capture_fraction=0.0,  # air-cooled: no liquid capture
    ),
}

CDU_MODELS: dict[str, CduModel] = {
    "ROW-CDU-1500": CduModel(
        name="row CDU, 1.5 MW",
        capacity_kw=1500.0,  # §9.3 row CDU 1.5-2.0 MW (M)
        approach_k=4.0,  # §9.3 L2L approach 3-5 K (M)
        max_flow_lpm=2250.0,  # §9.3 1.5 L/min per kW at capacity (M)
        pumps=2,  # §3.4 N+1 pumps (S)
        design_dp_kpa=150.0,  # §9.3 loop dP 0.5-3 bar (M)
    ),
    "INRACK-CDU-200": CduModel(
        name="in-rack CDU, 200 kW",
        capacity_kw=200.0,  # §3.5 in-rack 80-200 kW (S)
        approach_k=4.0,  # §9.3 (M)
        max_flow_lpm=300.0,  # 1.5 L/min/kW (M)
        pumps=2,  # (S)
        design_dp_kpa=100.0,  # (M)
    ),
}


class Assumptions(BaseModel):
    """Numbers the twin assumes where a site file and its telemetry say nothing.

    The simulator and the chain (``twin.chain``) read the same values, so a what-if never
    assumes something the simulated site does not do. Sections: docs/physics.md.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    continuous_load_factor: float = Field(
        0.8, gt=0, le=1, description="continuous load over breaker rating, NEC 210.20(A) (§4.2)"
    )
    power_factor: float = Field(
        0.98, gt=0, le=1, description="PDU power factor when none is measured; server PSUs (§4.2)"
    )
    psu_loss_const_w: float = Field(
        17.0, ge=0, description="constant PSU loss per node, RAPS rectifier model (§4.2 / §9.5)"
    )
    psu_efficiency: float = Field(
        0.96, gt=0, le=1, description="PSU efficiency at load, 80 PLUS Titanium at 50 % (§4.2)"
    )
    pump_speed_frac: float = Field(
        0.8, gt=0, le=1, description="CDU pump speed in normal operation, N+1 pumps (§3.4, L)"
    )
    design_dp_kpa: float = Field(
        100.0, gt=0, description="loop pressure drop at design flow when no CDU model (§9.3, M)"
    )
    pump_running_min_pct: float = Field(
        5.0, ge=0, description="a pump reporting more speed than this is running [%]"
    )
    stagnant_rise_k: float = Field(
        40.0, gt=0, description="cap on a loop's return rise when its flow stops [K] (L)"
    )


ASSUMPTIONS = Assumptions()
