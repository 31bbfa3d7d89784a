// Package network gives a pod its own network namespace, wired by CNI.
//
// There is no pause container: the namespace is a bind-mounted file under the netns dir
// (/var/run/netns/holdfast-<pod UID>), named from the pod UID so that setting up a pod's
// network again after a crash finds the same namespace. Every container of the pod joins it,
// so they reach each other on localhost. The loopback plugin always runs first (without it lo
// stays down), then the first network in the CNI conf dir.
package network
