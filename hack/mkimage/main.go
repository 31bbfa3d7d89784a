// Command mkimage writes the OCI image-layout tarballs holdfast's integration tests import into
// containerd: busybox.tar (docker.io/holdfast/busybox:test) and pause.tar
// (registry.k8s.io/pause:3.6), both built around the host's static busybox. No registry, no
// docker, no network.
//
//	go run ./hack/mkimage -o /var/cache/holdfast/images
//
// The output is deterministic; a tarball whose content would not change is left untouched, so
// re-running is cheap and never changes digests.
package main

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"

	"github.com/holdfast-dev/holdfast/test/ociimage"
	"github.com/holdfast-dev/holdfast/test/testenv/testimages"
)

func main() { os.Exit(doMain(os.Args[1:], os.Stdout, os.Stderr)) }

func doMain(args []string, stdout, stderr io.Writer) int {
	flags := flag.NewFlagSet("mkimage", flag.ContinueOnError)
	flags.SetOutput(stderr)
	outDir := flags.String("o", "", "directory to write the image tarballs to (required)")
	busyboxPath := flags.String("busybox", "/bin/busybox", "static busybox binary to put in the images (Debian package busybox-static)")
	verbose := flags.Bool("v", false, "report each tarball written or found up to date")
	if err := flags.Parse(args); err != nil {
		return 2
	}
	if *outDir == "" || flags.NArg() != 0 {
		fmt.Fprintln(stderr, "usage: mkimage -o DIR [-busybox PATH] [-v]")
		return 2
	}
	if err := run(*outDir, *busyboxPath, *verbose, stdout); err != nil {
		fmt.Fprintf(stderr, "mkimage: %v\n", err)
		return 1
	}
	return 0
}

func run(outDir, busyboxPath string, verbose bool, stdout io.Writer) error {
	busybox, err := os.ReadFile(busyboxPath)
	if err != nil {
		return fmt.Errorf("read busybox (install busybox-static, or pass -busybox): %w", err)
	}
	if err := os.MkdirAll(outDir, 0o755); err != nil {
		return fmt.Errorf("create output directory: %w", err)
	}
	images := testimages.Images(busybox)
	names := make([]string, 0, len(images))
	for name := range images {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		var buf bytes.Buffer
		if err := ociimage.WriteLayout(&buf, images[name]); err != nil {
			return fmt.Errorf("build %s: %w", name, err)
		}
		path := filepath.Join(outDir, name)
		written, err := writeIfChanged(path, buf.Bytes())
		if err != nil {
			return err
		}
		if verbose {
			state := "up to date"
			if written {
				state = "written"
			}
			fmt.Fprintf(stdout, "%s (%s): %s\n", path, images[name].Name, state)
		}
	}
	return nil
}

// writeIfChanged replaces path with data unless it already holds exactly data. The write goes
// through a temporary file and a rename, so a reader never sees half a tarball.
func writeIfChanged(path string, data []byte) (written bool, err error) {
	existing, err := os.ReadFile(path)
	if err == nil && bytes.Equal(existing, data) {
		return false, nil
	}
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return false, fmt.Errorf("read %s: %w", path, err)
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return false, fmt.Errorf("write %s: %w", path, err)
	}
	defer os.Remove(tmp.Name()) // no-op once renamed
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return false, fmt.Errorf("write %s: %w", tmp.Name(), err)
	}
	if err := tmp.Chmod(0o644); err != nil {
		tmp.Close()
		return false, fmt.Errorf("write %s: %w", tmp.Name(), err)
	}
	if err := tmp.Close(); err != nil {
		return false, fmt.Errorf("write %s: %w", tmp.Name(), err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return false, fmt.Errorf("write %s: %w", path, err)
	}
	return true, nil
}
