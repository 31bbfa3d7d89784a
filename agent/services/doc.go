// Package services gives containers the service link environment variables the kubelet gives
// them: KUBERNETES_SERVICE_HOST/PORT (and the docker-link style variables) of the `kubernetes`
// service in `default` always, and those of every service in the pod's namespace when the pod's
// enableServiceLinks is true (the default). Services come from an informer on every namespace
// (the Node authorizer lets a node list and watch services); the last known set is kept in a
// file of the state directory, so that pods started offline (after a reboot with the apiserver
// out of reach) get the variables they had.
package services
