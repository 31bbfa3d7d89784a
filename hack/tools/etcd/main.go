// Command etcd builds the upstream etcd server at the version pinned in go.mod, for holdfast's
// integration tests. It lives in a module of its own so that etcd's dependencies never reach
// holdfast's go.mod.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
