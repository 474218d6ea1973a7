"""The AWS adapter: EC2 GPU instances (spot and on-demand) and S3 checkpoint buckets.

- `provider`: `AwsProvider`, the `ComputeProvider` contract on EC2;
- `offers`: what is sold where, and its price (EC2 describes, Pricing API, catalog);
- `instances`: tags, gangs and instance states;
- `userdata`: the boot script that starts a job (no credentials, ever);
- `s3`: checkpoint buckets (encrypted, private, tagged);
- `errors`: botocore errors -> `FailureKind`, and the one retry at this edge;
- `_session`: lazy boto3 sessions, one per thread.

boto3 is imported lazily, inside functions: importing this package needs only the
standard library and Heliotrope. The IAM policy for exactly these calls is
`infra/aws/iam-policy.json`; docs/providers.md says how to set credentials up.
"""

from providers.aws.errors import AwsPermanentError, AwsTransientError
from providers.aws.instances import TAG_CLUSTER, TAG_JOB, TAG_REQUEST, client_token
from providers.aws.offers import OfferBook
from providers.aws.provider import DEFAULT_AMI_PARAMETER, AwsProvider

__all__ = [
    "DEFAULT_AMI_PARAMETER",
    "TAG_CLUSTER",
    "TAG_JOB",
    "TAG_REQUEST",
    "AwsPermanentError",
    "AwsProvider",
    "AwsTransientError",
    "OfferBook",
    "client_token",
]
