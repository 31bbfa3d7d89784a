// Package version carries holdfast's version, set at build time with
// -ldflags "-X github.com/holdfast-dev/holdfast/internal/version.Version=v1.2.3".
package version

// Version is reported by `holdfast version` and as the Node's kubeletVersion.
var Version = "v0.1.0-dev"
