package containerd

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/core/containers"
	"github.com/containerd/containerd/v2/core/mount"
	"github.com/containerd/containerd/v2/pkg/oci"
	"github.com/containerd/errdefs"
	"github.com/moby/sys/user"
	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// The image config and the user of a Linux container, as containerd's pkg/oci (v2.4)
// WithImageConfig, WithUser, WithUserID, WithUsername, WithAdditionalGIDs and
// WithAppendAdditionalGroups (with gids) set them, which this file replaces with the same results. Those
// read the container's /etc/passwd and /etc/group through containerd's internal/fsview, which
// executes a text/template for templated mount options; a reachable template execution makes
// the linker keep every exported method of every type in the binary (it cannot tell which one
// a template calls by name): about 6 MiB of the agent (issue 31). Here the rootfs is read
// through a read-only temporary mount of the snapshot, which is what containerd itself falls
// back to where fsview cannot open a mount; the files are parsed by pkg/oci's exported
// UserFromFS and GIDFromFS (their symlink handling and size caps kept).

// defaultUnixEnv is the environment of an image that sets none (pkg/oci's defaultUnixEnv).
var defaultUnixEnv = []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}

// withImageConfig applies img's config to a Linux container's spec: its environment under the
// one already set, Entrypoint+Cmd, working directory, user and the user's supplementary groups
// (oci.WithImageConfig).
func withImageConfig(img client.Image) oci.SpecOpts {
	return func(ctx context.Context, cl oci.Client, c *containers.Container, s *oci.Spec) error {
		ociImage, err := img.Spec(ctx)
		if err != nil {
			return fmt.Errorf("read image config of %q: %w", img.Name(), err)
		}
		config := ociImage.Config
		setProcess(s)
		env := config.Env
		if len(env) == 0 {
			env = defaultUnixEnv
		}
		s.Process.Env = replaceOrAppendEnvValues(env, s.Process.Env)
		s.Process.Args = append(config.Entrypoint, config.Cmd...)
		s.Process.Cwd = config.WorkingDir
		if s.Process.Cwd == "" {
			s.Process.Cwd = "/"
		}
		if config.User != "" {
			if err := withUser(config.User)(ctx, cl, c, s); err != nil {
				return err
			}
			return withAdditionalGIDs(strconv.FormatUint(uint64(s.Process.User.UID), 10))(ctx, cl, c, s)
		}
		// The image's /etc/group may give root supplementary groups even with no user set.
		return withAdditionalGIDs("root")(ctx, cl, c, s)
	}
}

// withUser sets the process's user from an OCI image config's User: user, uid, user:group,
// uid:gid, uid:group or user:gid (oci.WithUser).
func withUser(userstr string) oci.SpecOpts {
	return func(ctx context.Context, cl oci.Client, c *containers.Container, s *oci.Spec) error {
		defer ensureAdditionalGids(s)
		setProcess(s)
		s.Process.User.AdditionalGids = nil
		// runc requires IDs up to MaxInt32; containerd refuses more.
		parseID := func(v, what string) (uint32, bool, error) {
			n, err := strconv.Atoi(v)
			switch {
			case errors.Is(err, strconv.ErrRange):
				return 0, false, fmt.Errorf("invalid USER value %q: %s out of range", userstr, what)
			case err != nil:
				return 0, false, nil // a name
			case n < 0 || n > math.MaxInt32:
				return 0, false, fmt.Errorf("invalid USER value %q: %s out of range", userstr, what)
			}
			return uint32(n), true, nil
		}
		parts := strings.Split(userstr, ":")
		switch len(parts) {
		case 1:
			uid, isID, err := parseID(parts[0], "uid")
			if err != nil {
				return err
			}
			if !isID {
				return withUsername(userstr)(ctx, cl, c, s)
			}
			return withUserID(uid)(ctx, cl, c, s)
		case 2:
			uid, uidIsID, err := parseID(parts[0], "uid")
			if err != nil {
				return err
			}
			gid, gidIsID, err := parseID(parts[1], "gid")
			if err != nil {
				return err
			}
			// An empty part is no name but 0, as containerd takes it: USER ${UID}:${GID} with
			// GID unset builds "1000:", which runs as 1000:0 without reading the image.
			uidIsID = uidIsID || parts[0] == ""
			gidIsID = gidIsID || parts[1] == ""
			if uidIsID && gidIsID {
				s.Process.User.UID, s.Process.User.GID = uid, gid
				return nil
			}
			return withContainerRootFS(ctx, cl, c, s, func(root fs.FS) error {
				if !uidIsID {
					u, err := oci.UserFromFS(root, func(u user.User) bool { return u.Name == parts[0] })
					if err != nil {
						return err
					}
					uid = uint32(u.Uid)
				}
				if !gidIsID {
					gid, err = oci.GIDFromFS(root, func(g user.Group) bool { return g.Name == parts[1] })
					if err != nil {
						return err
					}
				}
				s.Process.User.UID, s.Process.User.GID = uid, gid
				return nil
			})
		default:
			return fmt.Errorf("invalid USER value %s", userstr)
		}
	}
}

// withUserID sets uid and its group from the image's /etc/passwd; a uid it does not list (or
// no /etc/passwd) gets group 0 (oci.WithUserID).
func withUserID(uid uint32) oci.SpecOpts {
	return func(ctx context.Context, cl oci.Client, c *containers.Container, s *oci.Spec) error {
		defer ensureAdditionalGids(s)
		setProcess(s)
		s.Process.User.AdditionalGids = nil
		return withContainerRootFS(ctx, cl, c, s, func(root fs.FS) error {
			u, err := oci.UserFromFS(root, func(u user.User) bool { return u.Uid == int(uid) })
			if errors.Is(err, fs.ErrNotExist) || errors.Is(err, oci.ErrNoUsersFound) {
				s.Process.User.UID, s.Process.User.GID = uid, 0
				return nil
			}
			if err != nil {
				return err
			}
			s.Process.User.UID, s.Process.User.GID = uint32(u.Uid), uint32(u.Gid)
			return nil
		})
	}
}

// withUsername sets the uid and group /etc/passwd gives username; not found is an error
// (oci.WithUsername).
func withUsername(username string) oci.SpecOpts {
	return func(ctx context.Context, cl oci.Client, c *containers.Container, s *oci.Spec) error {
		defer ensureAdditionalGids(s)
		setProcess(s)
		s.Process.User.AdditionalGids = nil
		return withContainerRootFS(ctx, cl, c, s, func(root fs.FS) error {
			u, err := oci.UserFromFS(root, func(u user.User) bool { return u.Name == username })
			if err != nil {
				return err
			}
			s.Process.User.UID, s.Process.User.GID = uint32(u.Uid), uint32(u.Gid)
			return nil
		})
	}
}

// withAdditionalGIDs sets the supplementary groups /etc/group lists the user (a uid or a
// name) in, not counting the group of the user's own name (oci.WithAdditionalGIDs).
func withAdditionalGIDs(userstr string) oci.SpecOpts {
	return func(ctx context.Context, cl oci.Client, c *containers.Container, s *oci.Spec) error {
		setProcess(s)
		s.Process.User.AdditionalGids = nil
		return withContainerRootFS(ctx, cl, c, s, func(root fs.FS) error {
			defer ensureAdditionalGids(s)
			username := userstr
			if uid, err := strconv.Atoi(userstr); err == nil {
				u, err := oci.UserFromFS(root, func(u user.User) bool { return u.Uid == uid })
				if errors.Is(err, fs.ErrNotExist) || errors.Is(err, oci.ErrNoUsersFound) {
					return nil
				}
				if err != nil {
					return err
				}
				username = u.Name
			}
			groups, err := groupsFromFS(root, func(g user.Group) bool {
				return g.Name != username && slices.Contains(g.List, username)
			})
			if errors.Is(err, fs.ErrNotExist) {
				return nil
			}
			if err != nil {
				return err
			}
			gids := []uint32{}
			for _, g := range groups {
				gids = append(gids, uint32(g.Gid))
			}
			s.Process.User.AdditionalGids = gids
			return nil
		})
	}
}

// withSupplementalGroups appends gids to the supplementary groups, in their order, the
// process's group kept among them (oci.WithAppendAdditionalGroups with gids, which would read
// the image's /etc/group, through a mount of its snapshot, only to resolve names: a pod's
// supplementalGroups are numbers).
func withSupplementalGroups(gids ...uint32) oci.SpecOpts {
	return func(_ context.Context, _ oci.Client, _ *containers.Container, s *oci.Spec) error {
		setProcess(s)
		s.Process.User.AdditionalGids = append(s.Process.User.AdditionalGids, gids...)
		ensureAdditionalGids(s)
		return nil
	}
}

// groupsFromFS is every group of root's /etc/group that filter (nil: any) accepts, in the
// file's order. oci.GIDFromFS returns the first one only: its filter collects them all and
// accepts none, so its open (symlinks resolved within root, size capped) reads the file.
func groupsFromFS(root fs.FS, filter func(user.Group) bool) ([]user.Group, error) {
	var groups []user.Group
	_, err := oci.GIDFromFS(root, func(g user.Group) bool {
		if filter == nil || filter(g) {
			groups = append(groups, g)
		}
		return false
	})
	if err != nil && !errors.Is(err, oci.ErrNoGroupsFound) {
		return nil, err
	}
	return groups, nil
}

// withContainerRootFS runs fn on the container's root filesystem, read-only: the spec's root
// path when the container has no snapshot (a rootfs given by path), else its snapshot mounted
// read-only in a temporary directory, activated first by containerd's mount manager when it
// has one (mounts it must format, such as EROFS).
func withContainerRootFS(ctx context.Context, cl oci.Client, c *containers.Container, s *oci.Spec, fn func(fs.FS) error) error {
	openRoot := func(path string) error {
		root, err := os.OpenRoot(path)
		if err != nil {
			return err
		}
		defer root.Close()
		return fn(root.FS())
	}
	if c.Snapshotter == "" && c.SnapshotKey == "" {
		if s.Root == nil || !filepath.IsAbs(s.Root.Path) {
			return errors.New("rootfs absolute path is required")
		}
		return openRoot(s.Root.Path)
	}
	if c.Snapshotter == "" {
		return errors.New("no snapshotter set for container")
	}
	if c.SnapshotKey == "" {
		return errors.New("rootfs snapshot not created for container")
	}
	mounts, err := cl.SnapshotService(c.Snapshotter).Mounts(ctx, c.SnapshotKey)
	if err != nil {
		return fmt.Errorf("mounts of snapshot %s: %w", c.SnapshotKey, err)
	}
	if mmc, ok := cl.(interface{ MountManager() mount.Manager }); ok && mmc.MountManager() != nil {
		mm := mmc.MountManager()
		id := "readonly-fs-" + c.ID + "-" + strconv.FormatInt(time.Now().UnixNano(), 36)
		active, err := mm.Activate(ctx, id, mounts)
		switch {
		case err == nil:
			defer mm.Deactivate(context.WithoutCancel(ctx), id)
			mounts = active.System
		case !errors.Is(err, errdefs.ErrNotImplemented):
			return fmt.Errorf("activate mounts of snapshot %s: %w", c.SnapshotKey, err)
		}
	}
	// Read-only, so that the unmount does not sync the whole filesystem.
	return mount.WithReadonlyTempMount(ctx, mounts, openRoot)
}

// replaceOrAppendEnvValues is defaults with overrides applied by key: a KEY=VALUE replaces or
// adds, a bare KEY removes (pkg/oci's, which oci.WithEnv applies too).
func replaceOrAppendEnvValues(defaults, overrides []string) []string {
	results := slices.Clone(defaults)
	index := make(map[string]int, len(defaults))
	for i, e := range defaults {
		k, _, _ := strings.Cut(e, "=")
		index[k] = i
	}
	for _, value := range overrides {
		k, _, set := strings.Cut(value, "=")
		i, exists := index[k]
		switch {
		case !set && exists:
			results[i] = "" // removed below
		case set && exists:
			results[i] = value
		case set:
			// Not indexed, as in pkg/oci: a later override of the same key appends again.
			results = append(results, value)
		}
	}
	return slices.DeleteFunc(results, func(e string) bool { return e == "" })
}

// setProcess gives s a process section if it has none.
func setProcess(s *oci.Spec) {
	if s.Process == nil {
		s.Process = &specs.Process{}
	}
}

// ensureAdditionalGids puts the primary group first among the supplementary ones unless
// they have it, as runc's spec expects from containerd.
func ensureAdditionalGids(s *oci.Spec) {
	setProcess(s)
	if !slices.Contains(s.Process.User.AdditionalGids, s.Process.User.GID) {
		s.Process.User.AdditionalGids = append([]uint32{s.Process.User.GID}, s.Process.User.AdditionalGids...)
	}
}
