"""The HTTP API's shared kit that every face's viewsets stand on; it knows no app's viewsets."""
