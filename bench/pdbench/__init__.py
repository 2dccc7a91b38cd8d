"""The benches' Python side, one package: the scripts in bench/ (run.py,
decider.py, fleet.py, kube_api_bytes.py, nohop.py) only call a module's `main()`.

  common         paths, logging, the processes a bench starts, HTTP, waiting,
                 CPU readings, Envoy and peer start-up, number formatting
  envoy          Envoy configurations built from the shipped envoy.yaml
  engines        mock-engine pods and the peer routers in front of a pair
  e2e            the end-to-end bench (bench/run.py)
  e2e_configs    its configurations and yardsticks
  e2e_report     its report, CSV files and plot
  decider        the decider's rows (bench/decider.py)
  fleet          the fleet simulation (bench/fleet.py)
  fleet_configs  its configurations, variants and defaults
  fleet_metrics  the trace's limit and each run's figures
  fleet_report   its report, CSV file and plot
  dynamo_peer    NVIDIA Dynamo's KV router as a fleet peer: its install,
                 start-up, the sims' records named back
  dynamo_shim    the sims' pods as Dynamo workers (run by bench/.venv-dynamo's
                 Python; stdlib only at import)
  kube_api_bytes the API server's bytes for pod discovery (bench/kube_api_bytes.py)
  kube           a real kube-apiserver and etcd (`just kube-apiserver`'s)
  epp            the endpoint picker's stack: GIE's EPP, its pool and pods,
                 deploy/envoy-epp's Envoy made local
  nohop          the no-hop rows (bench/nohop.py)
  nohop_configs  their rows, cells and targets
  nohop_report   their report, CSV files and plot

Imports go one way, from the scripts down to `common`: tests/layout.rs checks
that no module imports a script and that the modules import no cycle.
"""
