package volumes

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	v1 "k8s.io/api/core/v1"
)

// checkHostPath applies a hostPath volume's type check, with kubelet's semantics and
// messages: DirectoryOrCreate and FileOrCreate create what is missing (a file's parent
// directory is not created, as in kubelet); the other types only check. An unset type checks
// nothing, but a missing path is created as a directory, as containerd's CRI plugin does before
// bind-mounting it.
func checkHostPath(p string, pathType *v1.HostPathType) error {
	if !filepath.IsAbs(p) {
		return fmt.Errorf("invalid HostPath `%s`: must be an absolute path", p)
	}
	for _, item := range strings.Split(p, "/") {
		if item == ".." {
			return fmt.Errorf("invalid HostPath `%s`: must not contain '..'", p)
		}
	}
	t := v1.HostPathUnset
	if pathType != nil {
		t = *pathType
	}
	switch t {
	case v1.HostPathUnset:
		if _, err := os.Stat(p); errors.Is(err, fs.ErrNotExist) {
			return os.MkdirAll(p, 0o755)
		}
		return nil
	case v1.HostPathDirectoryOrCreate:
		if !exists(p) {
			if err := os.MkdirAll(p, 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
				return err
			}
		}
		return typeMatches(p, v1.HostPathDirectory, "directory")
	case v1.HostPathDirectory:
		return typeMatches(p, v1.HostPathDirectory, "directory")
	case v1.HostPathFileOrCreate:
		if !exists(p) {
			f, err := os.OpenFile(p, os.O_CREATE, 0o644)
			if err != nil && !errors.Is(err, fs.ErrExist) {
				return err
			}
			if f != nil {
				f.Close()
			}
		}
		return typeMatches(p, v1.HostPathFile, "file")
	case v1.HostPathFile:
		return typeMatches(p, v1.HostPathFile, "file")
	case v1.HostPathSocket:
		return typeMatches(p, v1.HostPathSocket, "socket file")
	case v1.HostPathCharDev:
		return typeMatches(p, v1.HostPathCharDev, "character device")
	case v1.HostPathBlockDev:
		return typeMatches(p, v1.HostPathBlockDev, "block device")
	default:
		return fmt.Errorf("%s is an invalid volume type", t)
	}
}

func exists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

func typeMatches(p string, want v1.HostPathType, expected string) error {
	got, err := hostPathTypeOf(p)
	if err != nil {
		return fmt.Errorf("hostPath type check failed, %s is not a %s, unable to determine its type: %w", p, expected, err)
	}
	if got != want {
		return fmt.Errorf("hostPath type check failed: %s is not a %s, it's a %s", p, expected, got)
	}
	return nil
}

// hostPathTypeOf names what is at p (following symlinks) with the HostPathType words kubelet
// uses in its messages.
func hostPathTypeOf(p string) (v1.HostPathType, error) {
	fi, err := os.Stat(p)
	if errors.Is(err, fs.ErrNotExist) {
		return "", fmt.Errorf("path %q does not exist", p)
	}
	if err != nil {
		return "", err
	}
	m := fi.Mode()
	switch {
	case m.IsDir():
		return v1.HostPathDirectory, nil
	case m.IsRegular():
		return v1.HostPathFile, nil
	case m&os.ModeSocket != 0:
		return v1.HostPathSocket, nil
	case m&os.ModeDevice != 0 && m&os.ModeCharDevice != 0:
		return v1.HostPathCharDev, nil
	case m&os.ModeDevice != 0:
		return v1.HostPathBlockDev, nil
	}
	return "", fmt.Errorf("only recognise file, directory, socket, block device and character device")
}
