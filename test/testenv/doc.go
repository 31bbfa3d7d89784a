// Package testenv starts the real components holdfast's integration tests stand on: a
// kube-apiserver with its etcd on loopback, a private containerd, and a CNI bridge network.
// Nothing here is faked: an integration test that passes has talked to the same binaries a
// gateway runs.
//
// Every integration test begins with RequireIntegration. Under `go test -short` it skips;
// otherwise a missing prerequisite (not root, binaries or images not built, containerd, runc or
// the CNI plugins not installed) fails the test with a message saying what is missing, because
// a skipped integration test in CI is a test that silently stopped running. `make test`
// installs and builds everything first.
//
// Prerequisites are found through environment variables, defaulting to the cache the hack/
// scripts fill:
//
//	HOLDFAST_TEST_BIN     kube-apiserver-v1.37.2 and etcd-v3.6.16 ($HOLDFAST_CACHE/bin)
//	HOLDFAST_TEST_IMAGES  busybox.tar and pause.tar               ($HOLDFAST_CACHE/images)
//	HOLDFAST_CACHE        defaults to /var/cache/holdfast
//	HOLDFAST_TEST_ROOT    parent of containerd roots               (/var/lib/holdfast-test)
//
// Tests in different packages run in parallel on one machine, so everything started here is
// private to the test: free loopback ports, its own directories, a bridge name and subnet drawn
// at random. Processes run in their own process group (and session), log to files in the test's
// directory, are killed with their group when the test ends, and the tail of their logs is
// printed when the test failed.
//
// Helpers fail the test (t.Fatalf) instead of returning errors, so call them from the test's
// own goroutine.
package testenv
