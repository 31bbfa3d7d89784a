package sdk

import "strings"

// ImageReference is a container image name split as the container runtime
// reads it.
type ImageReference struct {
	// Registry is the host[:port] part, "docker.io" when the name has none.
	Registry string
	// Repository is the path, with "library/" added for docker.io official
	// images ("nginx" -> "library/nginx").
	Repository string
	Tag        string
	Digest     string
}

// String returns the fully qualified name, e.g. "docker.io/library/nginx:1.27".
func (r ImageReference) String() string {
	s := r.Registry + "/" + r.Repository
	if r.Tag != "" {
		s += ":" + r.Tag
	}
	if r.Digest != "" {
		s += "@" + r.Digest
	}
	return s
}

// ParseImage splits an image name as docker and containerd do: the first
// path component is a registry if it contains "." or ":" or is "localhost".
func ParseImage(image string) ImageReference {
	var ref ImageReference
	name := image
	if i := strings.Index(name, "@"); i >= 0 {
		ref.Digest = name[i+1:]
		name = name[:i]
	}
	if i := strings.LastIndex(name, ":"); i >= 0 && !strings.Contains(name[i:], "/") {
		ref.Tag = name[i+1:]
		name = name[:i]
	}
	first, rest, found := strings.Cut(name, "/")
	if found && (strings.ContainsAny(first, ".:") || first == "localhost") {
		ref.Registry, ref.Repository = first, rest
	} else {
		ref.Registry, ref.Repository = "docker.io", name
	}
	if ref.Registry == "index.docker.io" {
		ref.Registry = "docker.io"
	}
	if ref.Registry == "docker.io" && !strings.Contains(ref.Repository, "/") {
		ref.Repository = "library/" + ref.Repository
	}
	if ref.Tag == "" && ref.Digest == "" {
		ref.Tag = "latest"
	}
	return ref
}
