package oci

import (
	"context"
	"fmt"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"github.com/airlock/airlock/internal/model"
)

// PullOptions configure Pull beyond Options.
type PullOptions struct {
	// Insecure reaches the registry over plain HTTP (go-containerregistry
	// already does for localhost, loopback and private addresses).
	Insecure bool
}

// Pull fetches ref (e.g. "docker.io/library/alpine:3.20",
// "registry.example/app@sha256:…") from its OCI registry and imports the
// image for o's platform as Import does; credentials come from the Docker
// config ($DOCKER_CONFIG, ~/.docker/config.json) as docker would use them,
// else anonymous. Layers stream from the registry into the applier
// (checked against their digests by the client and their diff_ids here);
// nothing is cached.
func Pull(ctx context.Context, dataDir, ref string, o Options, po PullOptions) (Report, error) {
	if err := o.Validate(); err != nil {
		return Report{}, err
	}
	var nopts []name.Option
	if po.Insecure {
		nopts = append(nopts, name.Insecure)
	}
	r, err := name.ParseReference(ref, nopts...)
	if err != nil {
		return Report{}, fmt.Errorf("pull %q: not an image reference: %v: %w", ref, err, model.ErrInvalid)
	}
	img, err := remote.Image(r, remote.WithContext(ctx), remote.WithAuthFromKeychain(authn.DefaultKeychain),
		remote.WithPlatform(v1.Platform{OS: o.OS, Architecture: o.Arch}))
	if err != nil {
		return Report{}, fmt.Errorf("pull %s: %w", r, err)
	}
	build, err := newBuild(dataDir)
	if err != nil {
		return Report{}, err
	}
	defer removeTree(build)
	return add(ctx, dataDir, build, r.String(), source{kind: "registry", image: img}, o)
}
