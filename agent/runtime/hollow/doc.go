// Package hollow is a container runtime and a pod network that exist only in memory: a
// hollow node, in the spirit of kubemark's, is holdfast with these in place of containerd and
// CNI (`holdfast hollow`), so that a hundred nodes or more run on one machine against one
// control plane, each a real client of the apiserver with its own identity, Lease, pods and
// status traffic. `make fleet` measures what such a fleet costs the control plane
// (docs/fleet.md).
//
// Nothing runs: a container is a record whose process "runs" from its start until it is
// stopped, or exits at once when its command is one whose exit status is known without
// running it (true, false, sh -c 'exit N'). Exits reach the pods manager as task events, as
// containerd's do. Images are "pulled" at their first use, instantly. Exec probes succeed
// on a running container, as kubemark's fake runtime answers them; interactive exec, attach
// and logs have no process behind them and say so. The state lives and dies with the
// process: a hollow node restarted comes back as a rebooted host would, with no containers.
//
// It is never what a gateway runs: only the `holdfast hollow` command builds an agent on it.
package hollow
