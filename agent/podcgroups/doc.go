// Package podcgroups owns the kubelet's cgroup hierarchy on the node: the kubepods cgroup,
// capped at the node's allocatable; its burstable and besteffort QoS levels (Guaranteed pods
// sit in kubepods itself); and one cgroup per pod, pod<uid>, that the runtime puts the pod's
// containers in. What goes in each cgroup is computed as the kubelet's pkg/kubelet/cm computes
// it (ResourceConfigForPod, the QoS manager's shares, node allocatable enforcement), by pure
// functions (resources.go) that the Manager (manager.go) writes through agent/cgroups.
//
// The layout, on the cgroupfs driver, below the configured cgroupRoot ("/" by default):
//
//	kubepods/                      memory and CPU shares of the node's allocatable
//	  pod<uid>/                    a Guaranteed pod
//	  burstable/                   CPU shares of the burstable pods' requests
//	    pod<uid>/<container>       limits of the pod (ResourceConfigForPod)
//	  besteffort/                  2 CPU shares
//	    pod<uid>/<container>
//
// With the systemd driver (systemd.go) the same cgroups are transient slices, named as the
// kubelet names them (naming.go: kubepods.slice, kubepods-burstable.slice,
// kubepods-burstable-pod<uid with - as _>.slice) and made and changed through systemd's D-Bus
// API; the Manager sees both drivers through one seam (Driver, driver.go), so what goes in
// each cgroup is computed once.
//
// Resize (issue 29 item 2) updates a running pod's cgroup with Manager.UpdatePod.
package podcgroups
