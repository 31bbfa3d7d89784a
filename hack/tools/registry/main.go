// Command registry builds the distribution project's OCI registry (the one behind Docker Hub
// and most private registries) at the version pinned in go.mod, for holdfast's integration
// tests: every image pull they test is a real pull over HTTP(S) from it. It lives in a module
// of its own so that the registry's dependencies never reach holdfast's go.mod.
//
// It is upstream's cmd/registry with only the storage drivers and the auth the tests use
// (filesystem, in-memory; htpasswd): the cloud drivers would triple the build for nothing.
// One command is added, `registry htpasswd USER PASSWORD`, printing an htpasswd line with the
// bcrypt hash the htpasswd auth requires, so the tests need no apache2-utils and holdfast's
// go.mod no bcrypt.
package main

import (
	"fmt"
	"os"

	"github.com/distribution/distribution/v3/registry"
	_ "github.com/distribution/distribution/v3/registry/auth/htpasswd"
	_ "github.com/distribution/distribution/v3/registry/storage/driver/filesystem"
	_ "github.com/distribution/distribution/v3/registry/storage/driver/inmemory"
	"github.com/spf13/cobra"
	"golang.org/x/crypto/bcrypt"
)

var htpasswdCmd = &cobra.Command{
	Use:   "htpasswd USER PASSWORD",
	Short: "prints an htpasswd line (bcrypt) for the htpasswd auth",
	Args:  cobra.ExactArgs(2),
	RunE: func(cmd *cobra.Command, args []string) error {
		hash, err := bcrypt.GenerateFromPassword([]byte(args[1]), bcrypt.MinCost)
		if err != nil {
			return err
		}
		fmt.Printf("%s:%s\n", args[0], hash)
		return nil
	},
}

func main() {
	registry.RootCmd.AddCommand(htpasswdCmd)
	if err := registry.RootCmd.Execute(); err != nil {
		os.Exit(1)
	}
}
