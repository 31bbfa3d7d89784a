// Package network gives a pod its own network namespace, wired by CNI.
//
// There is no pause container: the namespace is a bind-mounted file under the netns dir
// (/var/run/netns/holdfast-<pod UID>), named from the pod UID so that setting up a pod's
// network again after a crash finds the same namespace. Every container of the pod joins it,
// so they reach each other on localhost: the namespace is created with lo up (what CNI's
// loopback plugin would do, without its process at every ADD and DEL), and the first network
// in the CNI conf dir is added to it.
package network
